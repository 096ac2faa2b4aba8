"""How the spoke proves who it is to the hub: TLS trust, a client certificate, a bearer token.

Every file is re-read when it changes (compared by inode, size and mtime on each call, a
few stat(2) calls), so a renewed certificate or a rotated token takes effect on the next
call without a restart:

- the **token** (``--hub-token-file``) travels as ``authorization: Bearer <token>`` metadata
  on every call (RFC 6750 §2.1), Watch included;
- **certificates** (``--hub-ca``, ``--hub-cert``/``--hub-key``) live in the channel, so a
  change builds a new channel; :class:`spoke.hublink.client.HubClient` moves new calls to it and
  lets calls in flight on the old one finish.

A certificate and key caught half way through a renewal (the certificate replaced, the key
not yet) are not used: the key must match the certificate, otherwise the files are read
again on the next call and the current channel stays.

:func:`refusal` turns a failed call into the one-line reason an operator needs (wrong CA,
expired or foreign token, ...), or None when the failure is only the network.
"""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from spoke import metrics

log = logging.getLogger(__name__)

_TLS_WORDS = ("handshake", "ssl", "certificate", "tsi_", "alpn")


class CredentialError(ValueError):
    """A credential file is missing, unreadable, malformed, expired or mismatched."""


def file_stamp(path: Path | None) -> tuple[int, int, int] | None:
    """What tells a file changed: (inode, size, mtime ns); (-1, -1, -1) when it cannot be
    stat'ed, None for no path."""
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return (-1, -1, -1)
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def read_file(path: Path, what: str) -> bytes:
    """The bytes of ``path``.

    Raises:
        CredentialError: it cannot be read (the message names ``what``, e.g. the flag).
    """
    try:
        return path.read_bytes()
    except OSError as err:
        raise CredentialError(f"{what} {path}: {err.strerror or err}") from None


def read_token(path: Path, what: str = "--hub-token-file") -> str:
    """The token in ``path`` (surrounding whitespace removed).

    Raises:
        CredentialError: unreadable, empty, or not one line of visible ASCII.
    """
    raw = read_file(path, what)
    try:
        token = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        raise CredentialError(f"{what} {path}: not ASCII") from None
    if not token:
        raise CredentialError(f"{what} {path} is empty")
    if any(not 0x21 <= ord(c) <= 0x7E for c in token):
        raise CredentialError(f"{what} {path}: a token is one line of visible ASCII")
    return token


def load_certificate(path: Path, what: str) -> list[x509.Certificate]:
    """The PEM certificates in ``path``; the first one must be valid now.

    Raises:
        CredentialError: unreadable, not PEM, not yet valid or expired.
    """
    data = read_file(path, what)
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise CredentialError(f"{what} {path} is not a PEM certificate") from None
    now = datetime.datetime.now(datetime.UTC)
    first = certs[0]
    if first.not_valid_after_utc < now:
        raise CredentialError(
            f"{what} {path} expired on {first.not_valid_after_utc:%Y-%m-%d %H:%M} UTC"
        )
    if first.not_valid_before_utc > now:
        raise CredentialError(
            f"{what} {path} is not valid before {first.not_valid_before_utc:%Y-%m-%d %H:%M} UTC"
        )
    return certs


@dataclass(frozen=True)
class TlsMaterial:
    """PEM bytes for one channel: trust roots (None: the system's), client key and chain."""

    ca: bytes | None
    key: bytes | None
    chain: bytes | None

    def credentials(self) -> grpc.ChannelCredentials:
        """gRPC channel credentials from this material."""
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.chain
        )


class HubCredentials:
    """The spoke's credentials for the hub, re-read whenever their files change.

    Args:
        ca: PEM trust roots for the hub's certificate; with no ``ca`` but ``tls`` or a
            client certificate, the system's roots.
        cert: PEM client certificate chain (mutual TLS); needs ``key``.
        key: PEM private key of ``cert``.
        token_file: file holding the bearer token.
        server_name: the name the hub's certificate must carry, when it is not the host
            of ``--hub`` (TLS SNI and verification).
        tls: use TLS even without a CA file (system roots).

    Raises:
        CredentialError: a file is missing, malformed or expired, or only one of cert/key.
    """

    def __init__(
        self,
        *,
        ca: Path | None = None,
        cert: Path | None = None,
        key: Path | None = None,
        token_file: Path | None = None,
        server_name: str | None = None,
        tls: bool = False,
    ) -> None:
        if (cert is None) != (key is None):
            raise CredentialError("--hub-cert and --hub-key go together")
        self.ca, self.cert, self.key, self.token_file = ca, cert, key, token_file
        self.server_name = server_name
        self.tls = tls or ca is not None or cert is not None
        if server_name is not None and not self.tls:
            raise CredentialError("--hub-server-name needs TLS (--hub-ca)")
        self._tls_stamp = self._tls_files_stamp()
        self._warned: tuple[object, ...] | None = None
        self._material = self._load_tls() if self.tls else None
        self._token_stamp = file_stamp(token_file)
        self._token = read_token(token_file) if token_file is not None else None

    def _tls_files_stamp(self) -> tuple[object, ...]:
        return (file_stamp(self.ca), file_stamp(self.cert), file_stamp(self.key))

    def _load_tls(self) -> TlsMaterial:
        ca = chain = key = None
        if self.ca is not None:
            load_certificate(self.ca, "--hub-ca")
            ca = read_file(self.ca, "--hub-ca")
        if self.cert is not None and self.key is not None:
            certs = load_certificate(self.cert, "--hub-cert")
            key = read_file(self.key, "--hub-key")
            try:
                private = serialization.load_pem_private_key(key, password=None)
            except (ValueError, TypeError):
                raise CredentialError(
                    f"--hub-key {self.key} is not an unencrypted PEM private key"
                ) from None
            public = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
            if private.public_key().public_bytes(*public) != certs[0].public_key().public_bytes(
                *public
            ):
                raise CredentialError(f"--hub-key {self.key} does not match --hub-cert {self.cert}")
            chain = read_file(self.cert, "--hub-cert")
        return TlsMaterial(ca, key, chain)

    @property
    def material(self) -> TlsMaterial | None:
        """The TLS material in use (None: plaintext)."""
        return self._material

    def refresh_tls(self) -> TlsMaterial | None:
        """New TLS material when the certificate files changed since the last load and the
        new files are complete and consistent; None otherwise (keep the current channel)."""
        if not self.tls:
            return None
        stamp = self._tls_files_stamp()
        if stamp == self._tls_stamp:
            return None
        try:
            material = self._load_tls()
        except CredentialError as err:
            if stamp != self._warned:
                log.warning("not switching hub credentials yet: %s", err)
                self._warned = stamp
            return None  # stamp kept: tried again on the next call
        self._tls_stamp = stamp
        if material == self._material:
            return None
        self._material = material
        metrics.HUB_CREDENTIAL_RELOADS.labels("tls").inc()
        log.info("hub TLS credentials changed; new calls use the new ones")
        return material

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Call metadata carrying the current token (re-read when its file changed)."""
        if self.token_file is None:
            return ()
        stamp = file_stamp(self.token_file)
        if stamp != self._token_stamp:
            try:
                token = read_token(self.token_file)
            except CredentialError as err:
                log.warning("keeping the previous hub token: %s", err)
            else:
                if token != self._token:
                    metrics.HUB_CREDENTIAL_RELOADS.labels("token").inc()
                    log.info("hub token file %s changed; using the new token", self.token_file)
                self._token, self._token_stamp = token, stamp
        return (("authorization", f"Bearer {self._token}"),)

    def channel_options(self) -> list[tuple[str, str]]:
        """Extra channel options (the TLS name override)."""
        if self.server_name is None:
            return []
        return [("grpc.ssl_target_name_override", self.server_name)]


def refusal(err: grpc.aio.AioRpcError, target: str) -> str | None:
    """The one-line reason the hub refused this spoke, or None for other failures.

    Refusals: the token (UNAUTHENTICATED), the token's scope (PERMISSION_DENIED), and TLS
    (a handshake that failed: wrong CA, wrong name, client certificate refused, plaintext
    against TLS).
    """
    code = err.code()
    details = err.details() or ""
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return f"hub {target} refused the token: {details} (check --hub-token-file)"
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return f"hub {target} denied access: {details}"
    if code == grpc.StatusCode.UNAVAILABLE and any(w in details.lower() for w in _TLS_WORDS):
        return f"TLS with hub {target} failed: {_tls_reason(details)}"
    return None


def _tls_reason(details: str) -> str:
    lower = details.lower()
    if "certificate_verify_failed" in lower or "certificate verify failed" in lower:
        return "the hub's certificate is not trusted by --hub-ca (or does not name the hub)"
    if "wrong_version_number" in lower or "wrong version number" in lower:
        return "the hub does not speak TLS (drop --hub-ca) or speaks another protocol"
    if "alert" in lower and "certificate" in lower:
        return "the hub refused this spoke's client certificate (--hub-cert)"
    return details.rpartition(": ")[2] or details
