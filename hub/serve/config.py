"""How a hub server is configured: its limits and TLS (:class:`ServerConfig`), the gRPC core
options that follow from them (:func:`server_options`), and the check that its address can
be bound (:func:`check_bindable`). :mod:`hub.serve.server` runs what this describes.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

import grpc

from hub.audit import DEFAULT_BACKUPS, DEFAULT_MAX_BYTES
from hub.auth.grants import DEFAULT_LIFETIME_S, HOLDERS_PER_TOKEN
from hub.errors import ConfigError, ListenError
from hub.limits.budget import (
    BYTES_PER_TOKEN,
    STALL_S,
    STREAMS,
    STREAMS_PER_TOKEN,
    TOTAL_BYTES,
    WAIT_S,
)
from hub.limits.sizes import HANDSHAKE_TIMEOUT_S, MAX_CONNECTIONS, connection_options
from hub.limits.streams import MANIFEST_STREAMS, TOKEN_SHARE, WATCH_STREAMS
from hub.serve.address import Address
from hub.serve.bulk import MAX_CONNECTIONS as BULK_CONNECTIONS
from hub.serve.watch import POLL_SECONDS
from hub.serve.wire import CORE_REQUEST_BYTES
from hub.snapshot.blocks import MiB

MAX_MESSAGE_BYTES = 4 * MiB
"""Default largest gRPC message sent, bytes (gRPC's usual default receive limit, which
spokes keep). Block data goes out in chunks of at most :data:`hub.serve.wire.CHUNK_BYTES`.
Requests have their own, far smaller limits: :data:`hub.serve.wire.MAX_REQUEST_BYTES` and
:data:`hub.serve.wire.CORE_REQUEST_BYTES`."""

MIN_MESSAGE_BYTES = 64 * 1024
"""Smallest message size limit accepted, bytes (a chunk must fit with room to spare)."""

MIB_FLOOR = MiB
"""Smallest read budget accepted, bytes (a block larger than the budget still passes
alone)."""


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """How a hub server runs, beyond its data directory and address.

    Attributes:
        tls_cert: PEM certificate chain; serving TLS needs it and ``tls_key``.
        tls_key: PEM private key of ``tls_cert``.
        client_ca: PEM CA bundle; when set, clients must present a certificate it
            signed (mutual TLS). Needs ``tls_cert``.
        tokens: Token file (:mod:`hub.auth.tokens`, re-read on change); None serves everyone
            without tokens. Refused without TLS unless ``insecure``.
        insecure: Allow ``tokens`` and read grants over plaintext (trusted networks, tests).
        audit_log: JSON-lines audit file (:mod:`hub.audit`); ``DATA_DIR/audit.jsonl``.
        audit_max_bytes: The audit file is rotated before it passes this size, bytes.
        audit_backups: Rotated audit files kept.
        max_message_bytes: Largest gRPC message sent, bytes (requests:
            :data:`hub.serve.wire.MAX_REQUEST_BYTES`).
        blobs: The blob store (a path or ``s3://BUCKET/PREFIX``); None for the recorded
            one, else ``DATA_DIR/blobs``.
        s3_endpoint: The S3 endpoint URL for ``s3://`` blob stores.
        catalog: A shared catalog's URL (``postgresql://…``, :mod:`hub.catalog.postgres`)
            that other replicas serve too; None for ``DATA_DIR/catalog``.
        poll_s: How often the catalog is polled for changes by other processes, seconds.
        grant_key: Ed25519 private key (PEM) that signs read grants (:mod:`hub.auth.grants`);
            None for ``DATA_DIR/grant.key``, generated at the first start. Grants, like
            tokens, are issued only over TLS unless ``insecure``.
        grant_lifetime_s: How long a read grant is valid, seconds.
        rotate_grant_key: With a shared catalog, record this replica's grant key as the
            one every replica signs with, replacing the recorded one (a replica whose key
            differs from the recorded one refuses to start otherwise).
        max_connections: Most client connections open at once (:mod:`hub.limits.sizes`).
        handshake_timeout_s: Longest a connection may take to finish its TLS handshake and
            send its HTTP/2 settings, seconds.
        max_streams_per_token: Most ReadBlocks streams one token may have open
            (:mod:`hub.limits.budget`).
        max_block_streams: Most ReadBlocks streams open at once over every token.
        max_bytes_per_token: Most block bytes held for one token's streams.
        max_bytes_in_flight: Most block bytes held for every stream together.
        budget_wait_s: Longest a stream waits for room in the read budget, seconds.
        stall_timeout_s: Longest one send of a block's bytes may make no progress before
            its stream is ended and its charge released, seconds.
        grant_holders_per_token: Most holder keys one token may hold live read grants for
            (:class:`hub.auth.grants.GrantLimiter`).
        max_manifest_streams: Most GetManifest streams open at once (:mod:`hub.limits.streams`).
        max_watch_streams: Most Watch streams open at once.
        bulk_port: Serve the bulk block channel (:mod:`hub.serve.bulk`) on this port of the
            gRPC address's host (0: a free one); None: no bulk channel.
        bulk_max_connections: Most bulk connections open at once.
    """

    tls_cert: Path | None = None
    tls_key: Path | None = None
    client_ca: Path | None = None
    tokens: Path | None = None
    insecure: bool = False
    audit_log: Path | None = None
    audit_max_bytes: int = DEFAULT_MAX_BYTES
    audit_backups: int = DEFAULT_BACKUPS
    max_message_bytes: int = MAX_MESSAGE_BYTES
    blobs: str | None = None
    s3_endpoint: str | None = None
    catalog: str | None = None
    poll_s: float = POLL_SECONDS
    grant_key: Path | None = None
    grant_lifetime_s: float = DEFAULT_LIFETIME_S
    rotate_grant_key: bool = False
    max_connections: int = MAX_CONNECTIONS
    handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S
    max_streams_per_token: int = STREAMS_PER_TOKEN
    max_block_streams: int = STREAMS
    max_bytes_per_token: int = BYTES_PER_TOKEN
    max_bytes_in_flight: int = TOTAL_BYTES
    budget_wait_s: float = WAIT_S
    stall_timeout_s: float = STALL_S
    grant_holders_per_token: int = HOLDERS_PER_TOKEN
    max_manifest_streams: int = MANIFEST_STREAMS
    max_watch_streams: int = WATCH_STREAMS
    bulk_port: int | None = None
    bulk_max_connections: int = BULK_CONNECTIONS

    def credentials(self) -> grpc.ServerCredentials | None:
        """The TLS credentials, or None for plaintext.

        Raises:
            ConfigError: Only one of certificate and key given, a client CA without a
                certificate, or a file that cannot be read.
        """
        if self.tls_cert is None and self.tls_key is None:
            if self.client_ca is not None:
                raise ConfigError("--client-ca needs --tls-cert and --tls-key")
            return None
        if self.tls_cert is None or self.tls_key is None:
            raise ConfigError("TLS needs both --tls-cert and --tls-key")
        key, cert = _read_pem(self.tls_key), _read_pem(self.tls_cert)
        ca = _read_pem(self.client_ca) if self.client_ca is not None else None
        try:
            return grpc.ssl_server_credentials(
                [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
            )
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ConfigError(f"unusable TLS certificate or key: {exc}") from exc

    def validate(self) -> None:
        """Checks the plain values.

        Raises:
            ConfigError: ``max_message_bytes``, ``poll_s``, a connection limit, a read
                budget limit, the grant limit or an audit limit is out of range.
        """
        if self.audit_max_bytes < 1024 or self.audit_backups < 1:
            raise ConfigError(
                f"audit log limits out of range: --audit-max-bytes {self.audit_max_bytes} "
                f"(at least 1024), --audit-backups {self.audit_backups} (at least 1)"
            )
        if self.max_message_bytes < MIN_MESSAGE_BYTES:
            raise ConfigError(
                f"max message size {self.max_message_bytes} bytes is below "
                f"{MIN_MESSAGE_BYTES} bytes"
            )
        if not 0 < self.poll_s <= 60:
            raise ConfigError(f"poll interval {self.poll_s} s is not in (0, 60]")
        if self.max_connections < 1:
            raise ConfigError(f"--max-connections {self.max_connections} is not at least 1")
        if not 0.1 <= self.handshake_timeout_s <= 120:
            raise ConfigError(
                f"--handshake-timeout {self.handshake_timeout_s} s is not in [0.1, 120]"
            )
        if self.max_streams_per_token < 1 or self.grant_holders_per_token < 1:
            raise ConfigError(
                f"--max-streams-per-token {self.max_streams_per_token} and "
                f"--grant-holders-per-token {self.grant_holders_per_token} must be at least 1"
            )
        if self.max_block_streams < self.max_streams_per_token:
            raise ConfigError(
                f"--max-block-streams {self.max_block_streams} must be at least "
                f"--max-streams-per-token {self.max_streams_per_token}"
            )
        if not MIB_FLOOR <= self.max_bytes_per_token <= self.max_bytes_in_flight:
            raise ConfigError(
                f"--max-bytes-per-token {self.max_bytes_per_token} must be at least {MIB_FLOOR} "
                f"and at most --max-bytes-in-flight {self.max_bytes_in_flight}"
            )
        if not 0 <= self.budget_wait_s <= 600:
            raise ConfigError(f"--budget-wait {self.budget_wait_s} s is not in [0, 600]")
        if not 0 < self.stall_timeout_s <= 3600:
            raise ConfigError(f"--stall-timeout {self.stall_timeout_s} s is not in (0, 3600]")
        if min(self.max_manifest_streams, self.max_watch_streams) < TOKEN_SHARE:
            raise ConfigError(
                f"--max-manifest-streams {self.max_manifest_streams} and --max-watch-streams "
                f"{self.max_watch_streams} must be at least {TOKEN_SHARE}"
            )
        if self.bulk_port is not None and not 0 <= self.bulk_port <= 65535:
            raise ConfigError(f"--bulk-port {self.bulk_port} is not a port (0 to 65535)")
        if self.bulk_max_connections < 1:
            raise ConfigError(f"--bulk-max-connections {self.bulk_max_connections} must be >= 1")


def _read_pem(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if b"-----BEGIN " not in data:
        raise ConfigError(f"{path} is not a PEM file")
    return data


def server_options(
    max_message_bytes: int,
    max_connections: int = MAX_CONNECTIONS,
    handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
) -> tuple[tuple[str, int], ...]:
    """gRPC core options for a hub with the given limits.

    Args:
        max_message_bytes: The largest message sent, bytes (the receive limit is
            :data:`hub.serve.wire.CORE_REQUEST_BYTES`, whatever this is).
        max_connections: Most client connections open at once (:mod:`hub.limits.sizes`).
        handshake_timeout_s: Longest a TLS handshake and HTTP/2 settings may take, seconds.

    Returns:
        ``(name, value)`` pairs for :func:`grpc.aio.server`.
    """
    return (
        *connection_options(max_connections, handshake_timeout_s),
        ("grpc.max_send_message_length", max_message_bytes),
        # a request still arriving holds at most one stream window (hub.serve.wire)
        ("grpc.max_receive_message_length", CORE_REQUEST_BYTES),
        # Without this a second server could bind the same port and steal half the calls.
        ("grpc.so_reuseport", 0),
        # Requests are small (digests, names), so the window a client may send into stays
        # at HTTP/2's 64 KiB instead of growing with bandwidth-delay probes: a call refused
        # before its request is read then leaves at most that much buffered in gRPC core
        # (with probes, 32 refused 8 MiB calls at once could leave 400 MiB).
        ("grpc.http2.bdp_probe", 0),
        # Spokes ping every 10 s, idle Watch streams included, to find dead links (their
        # HubClient): allow it rather than answer with GOAWAY "too_many_pings".
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    )


SERVER_OPTIONS = server_options(MAX_MESSAGE_BYTES)
"""Core options of a hub with the default limits."""


def check_bindable(address: Address) -> None:
    """Tries to bind ``address`` with a plain socket, to report why gRPC would fail.

    gRPC's own bind failure gives no reason and logs to stderr from C++, so the server
    checks first. With port 0 only the host is checked (is it a local address?).

    Args:
        address: The address to check.

    Raises:
        ListenError: The host does not resolve, or an address it resolves to cannot be
            bound (in use, not a local address).
    """
    try:
        infos = socket.getaddrinfo(
            address.host, address.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        raise ListenError(f"cannot listen on {address}: {exc.strerror}") from exc
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as probe:
            # gRPC sets SO_REUSEADDR too, so a port in TIME_WAIT is not "in use".
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
            except OSError as exc:
                raise ListenError(f"cannot listen on {address}: {exc.strerror}") from exc
