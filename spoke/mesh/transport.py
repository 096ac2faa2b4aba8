"""How the spokes of a region reach each other: TLS certificates and the region's token,
both re-read when their files change, as the hub's are (:mod:`spoke.hublink.credentials`).

- **TLS** (``--peer-cert``/``--peer-key``, the same pair serving the peer port and, with
  ``--peer-ca``, presented to peers as the client certificate: mTLS). The server side uses
  gRPC's dynamic server credentials: core asks :meth:`PeerTls.server_config` at every new
  connection, which answers new certificates once their files changed and are complete (a
  key matching its certificate). Clients compare the files' stamps before each call and
  build a new channel when they changed; calls in flight finish on the old one.
- **Token** (``--peer-token-file``): sent as ``authorization: Bearer`` on every call and
  required by the peer port. A changed file is used from the next call; the peer port
  keeps accepting the previous token for :data:`TOKEN_GRACE_S`, so a rotation rolled out
  file by file across a region never refuses a call.
- **Connections** (:func:`server_options`): the peer port holds at most
  ``--peer-max-connections`` (each spoke of the region holds one to every other, two for
  a minute after a certificate renewal); its door (:mod:`strata_local.door`) accepts
  them and shares the slots by address, keeping those that showed the token
  (:mod:`strata_local.doorslots`), while gRPC behind it (its cap twice the door's)
  closes a connection that has not finished its TLS handshake and
  sent its HTTP/2 settings within :data:`HANDSHAKE_TIMEOUT_S` (120 s in gRPC core) and one
  with no call for :data:`IDLE_S` (peers probe every 2 s), and carries at most
  :data:`MAX_STREAMS` calls per connection. A connection pending its TLS handshake costs
  about 45 KiB: 12,000 idle ones took a daemon from 94 to 969 MiB in three rounds before
  these limits, with them it stays under 200 MiB (``spoke/DESIGN.md``).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography.hazmat.primitives import serialization

from spoke.hublink.credentials import (
    CredentialError,
    file_stamp,
    load_certificate,
    read_file,
    read_token,
)
from spoke.mesh import metrics

log = logging.getLogger(__name__)

TOKEN_GRACE_S = 60.0
"""How long the previous region token is still accepted after the file changed, seconds."""

RECHECK_S = 1.0
"""Least time between two looks at the certificate files from the client side, seconds."""

MAX_CONNECTIONS = 1024
"""Default most connections open to the peer port at once (``--peer-max-connections``)."""

HANDSHAKE_TIMEOUT_S = 5.0
"""Longest a connection to the peer port may take to finish its TLS handshake and send its
HTTP/2 settings, seconds (peers are in one region: a handshake takes milliseconds)."""

IDLE_S = 60.0
"""A peer port connection without a call for this long is closed (GOAWAY), seconds."""

MAX_STREAMS = 128
"""Most calls one connection to the peer port carries at once (a caller gets 32 in flight,
:class:`spoke.mesh.admission.CallerLimits`; more are queued by its client)."""


def server_options(max_connections: int = MAX_CONNECTIONS) -> list[tuple[str, int]]:
    """gRPC core options bounding what callers may hold open at the peer port.

    Args:
        max_connections: Most connections open at once.

    Returns:
        ``(name, value)`` pairs for :func:`grpc.aio.server`.
    """
    return [
        ("grpc.max_allowed_incoming_connections", max_connections),
        ("grpc.server_handshake_timeout_ms", round(HANDSHAKE_TIMEOUT_S * 1000)),
        ("grpc.max_connection_idle_ms", round(IDLE_S * 1000)),
        ("grpc.max_concurrent_streams", MAX_STREAMS),
        # requests are small: the window callers may send into stays at HTTP/2's 64 KiB
        # instead of growing with bandwidth-delay probes (peerservice.REQUEST_BYTES)
        ("grpc.http2.bdp_probe", 0),
    ]


class PeerToken:
    """The region's token in a file, re-read when the file changes.

    Args:
        path: the token file.
        grace_s: how long the previous token is accepted after a change, seconds.
        now: the monotonic clock (injectable for tests).

    Raises:
        CredentialError: the file is unreadable, empty or not one line of visible ASCII.
    """

    def __init__(
        self, path: Path, grace_s: float = TOKEN_GRACE_S, now: Callable[[], float] = time.monotonic
    ) -> None:
        self.path = path
        self.grace_s = grace_s
        self._now = now
        self._stamp = file_stamp(path)
        self._token = read_token(path, "--peer-token-file")
        self._previous: tuple[bytes, float] | None = None  # (Bearer value, accepted until)

    def current(self) -> str:
        """The token now (the file is re-read if it changed; a broken file keeps the old)."""
        stamp = file_stamp(self.path)
        if stamp != self._stamp:
            try:
                token = read_token(self.path, "--peer-token-file")
            except CredentialError as err:
                log.warning("keeping the previous peer token: %s", err)
            else:
                if token != self._token:
                    self._previous = (_bearer(self._token), self._now() + self.grace_s)
                    metrics.PEER_CREDENTIAL_RELOADS.labels("token").inc()
                    log.info(
                        "peer token file %s changed: the old token is still accepted for %g s",
                        self.path,
                        self.grace_s,
                    )
                self._token = token
                self._stamp = stamp
        return self._token

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Call metadata carrying the current token."""
        return (("authorization", f"Bearer {self.current()}"),)

    def accepts(self, presented: str | bytes) -> bool:
        """Whether ``presented`` (the ``authorization`` value) is ``Bearer`` the current
        token, or the previous one within its grace (compared in constant time)."""
        raw = presented.encode() if isinstance(presented, str) else bytes(presented)
        ok = secrets.compare_digest(raw, _bearer(self.current()))
        if self._previous is not None:
            old, until = self._previous
            if self._now() > until:
                self._previous = None
            elif secrets.compare_digest(raw, old):
                ok = True
        return ok


def _bearer(token: str) -> bytes:
    return f"Bearer {token}".encode()


@dataclass(frozen=True)
class TlsFiles:
    """PEM bytes of one load: the certificate chain, its key, and the CA (or None)."""

    chain: bytes
    key: bytes
    ca: bytes | None


class PeerTls:
    """The peer port's certificates, re-read when their files change.

    Args:
        cert: this spoke's certificate chain (PEM): the peer port's, and its client
            certificate towards other spokes.
        key: its private key (PEM).
        ca: the CA peers' certificates must chain to; with it, the peer port requires
            client certificates (mTLS) and clients verify peers against it (else against
            the system's roots).
        server_name: the name peers' certificates carry when it is not the host they are
            dialled by (one certificate for the region's spokes, whose addresses change).
        now: the monotonic clock (injectable for tests).

    Raises:
        CredentialError: a file is missing, malformed or expired, or the key does not match.
    """

    def __init__(
        self,
        cert: Path,
        key: Path,
        ca: Path | None = None,
        server_name: str | None = None,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cert, self.key, self.ca = cert, key, ca
        self.server_name = server_name
        self._now = now
        self._lock = threading.Lock()  # the server's fetcher runs on a gRPC core thread
        self._stamp = self._stamps()
        self.files = self._load()
        self.generation = 0  # bumped at each change
        self._checked = now()
        self._warned: object = None

    def _stamps(self) -> tuple[object, ...]:
        return (file_stamp(self.cert), file_stamp(self.key), file_stamp(self.ca))

    def _load(self) -> TlsFiles:
        certs = load_certificate(self.cert, "--peer-cert")
        key = read_file(self.key, "--peer-key")
        try:
            private = serialization.load_pem_private_key(key, password=None)
        except (ValueError, TypeError):
            raise CredentialError(
                f"--peer-key {self.key} is not an unencrypted PEM private key"
            ) from None
        public = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        if private.public_key().public_bytes(*public) != certs[0].public_key().public_bytes(
            *public
        ):
            raise CredentialError(f"--peer-key {self.key} does not match --peer-cert {self.cert}")
        ca = None
        if self.ca is not None:
            load_certificate(self.ca, "--peer-ca")
            ca = read_file(self.ca, "--peer-ca")
        return TlsFiles(read_file(self.cert, "--peer-cert"), key, ca)

    def refresh(self) -> bool:
        """Re-read the files if they changed and are complete; True when new ones are in
        use. A half-renewed pair (a key not matching its certificate) is tried again later."""
        with self._lock:
            stamp = self._stamps()
            if stamp == self._stamp:
                return False
            try:
                files = self._load()
            except CredentialError as err:
                if stamp != self._warned:
                    log.warning("not switching peer certificates yet: %s", err)
                    self._warned = stamp
                return False
            self._stamp = stamp
            if files == self.files:
                return False
            self.files = files
            self.generation += 1
        metrics.PEER_CREDENTIAL_RELOADS.labels("tls").inc()
        log.info("peer TLS certificates changed: new connections use the new ones")
        return True

    def client_generation(self) -> int:
        """The generation clients should be on (files looked at once per :data:`RECHECK_S`)."""
        now = self._now()
        if now - self._checked >= RECHECK_S:
            self._checked = now
            self.refresh()
        return self.generation

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Client credentials of the current files: verify peers against the CA, present
        this spoke's certificate."""
        files = self.files
        return grpc.ssl_channel_credentials(
            root_certificates=files.ca, private_key=files.key, certificate_chain=files.chain
        )

    def channel_options(self) -> list[tuple[str, str]]:
        """The TLS name override, when peers' certificates carry ``server_name``."""
        if self.server_name is None:
            return []
        return [("grpc.ssl_target_name_override", self.server_name)]

    def _server_config(self, files: TlsFiles) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration(
            [(files.key, files.chain)], root_certificates=files.ca
        )

    def server_config(self) -> grpc.ServerCertificateConfiguration | None:
        """New certificates for the next handshake, or None to keep the current ones
        (called by gRPC core, on its own thread, at each new connection)."""
        return self._server_config(self.files) if self.refresh() else None

    def server_credentials(self) -> grpc.ServerCredentials:
        """Server credentials that follow the files; with a CA, client certificates are
        required (mTLS)."""
        return grpc.dynamic_ssl_server_credentials(
            self._server_config(self.files),
            self.server_config,
            require_client_authentication=self.ca is not None,
        )
