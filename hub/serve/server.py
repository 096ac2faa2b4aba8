"""Running the hub's gRPC server: on the caller's event loop, or on a background thread.

:meth:`HubServer.start` is what the CLI uses; :class:`hub.serve.serverthread.ServerThread`
runs the same server on its own event loop in a thread, so that synchronous code (tests,
benchmarks) can start a hub and talk to it with a blocking client.

Besides ``protocol.hub.v1.Hub`` the server offers the standard health checking service
(``grpc.health.v1.Health``; https://github.com/grpc/grpc/blob/master/doc/health-checking.md)
and server reflection (``grpc.reflection.v1alpha.ServerReflection``; gRFC/doc
https://github.com/grpc/grpc/blob/master/doc/server-reflection.md). Both are open
without a token: probes (e.g. Kubernetes' gRPC liveness probes) carry none, and the
schema reflection reveals is public (``protocol/hub/v1/hub.proto``).

Shutdown (:meth:`HubServer.stop`) reports NOT_SERVING on the health service first, ends
the open ``Watch`` streams with OK, refuses new calls, and lets calls in flight (block
streams) finish for a grace period before cancelling them (gRPC's graceful stop).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc  # type: ignore[import-untyped]
from grpc_reflection.v1alpha import reflection  # type: ignore[import-untyped]

from hub.audit import DEFAULT_BACKUPS, DEFAULT_MAX_BYTES, AuditLog
from hub.auth.grants import (
    DEFAULT_LIFETIME_S,
    HOLDERS_PER_TOKEN,
    GrantIssuer,
    GrantLimiter,
    ensure_grant_key,
)
from hub.auth.tokens import TokenFile
from hub.catalog import Catalog
from hub.errors import ConfigError, ListenError
from hub.limits.budget import (
    BYTES_PER_TOKEN,
    STALL_S,
    STREAMS,
    STREAMS_PER_TOKEN,
    TOTAL_BYTES,
    WAIT_S,
    ReadBudget,
)
from hub.limits.sizes import HANDSHAKE_TIMEOUT_S, MAX_CONNECTIONS, connection_options
from hub.limits.streams import MANIFEST_STREAMS, TOKEN_SHARE, WATCH_STREAMS
from hub.serve.address import Address
from hub.serve.bulk import MAX_CONNECTIONS as BULK_CONNECTIONS
from hub.serve.bulk import BulkServer, tls_context
from hub.serve.gate import HubGate
from hub.serve.metrics import HubMetrics
from hub.serve.service import HubService
from hub.serve.watch import POLL_SECONDS, CatalogWatcher
from hub.serve.wire import CHUNK_BYTES, CORE_REQUEST_BYTES, MAX_REQUEST_BYTES, SERVICE_NAME, HubWire
from hub.snapshot.blocks import MiB
from hub.store.datadir import DataDir
from protocol.hub.v1 import hub_pb2_grpc
from strata_local import grpclog
from strata_local.memory import trim_forever

logger = logging.getLogger(__name__)

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

GRACE_SECONDS = 5.0
"""How long :meth:`HubServer.stop` lets calls in flight finish, seconds."""


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
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
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


class HubServer:
    """A started gRPC hub server over one data directory.

    Use :meth:`start`; stop with :meth:`stop`.

    Attributes:
        address: The bound address (the real port, never 0).
        data_dir: The data directory being served.
        metrics: The server's counters.
        config: The settings it runs with.
    """

    def __init__(
        self,
        server: grpc.aio.Server,
        catalog: Catalog,
        watcher: CatalogWatcher,
        health_servicer: health.aio.HealthServicer,
        address: Address,
        data_dir: DataDir,
        metrics: HubMetrics,
        config: ServerConfig,
        audit: AuditLog | None = None,
    ) -> None:
        self._server = server
        self._audit = audit
        self._catalog = catalog
        self._watcher = watcher
        self._health = health_servicer
        self.address = address
        self.data_dir = data_dir
        self.metrics = metrics
        self.config = config
        self._unwatch: Callable[[], None] = lambda: None
        self._trimmer: asyncio.Task[None] | None = None
        self.bulk: BulkServer | None = None

    @property
    def port(self) -> int:
        """The bound TCP port."""
        return self.address.port

    @classmethod
    async def start(
        cls,
        data_dir: str | os.PathLike[str],
        listen: str,
        *,
        metrics: HubMetrics | None = None,
        config: ServerConfig | None = None,
    ) -> HubServer:
        """Opens the data directory, binds ``listen`` and starts serving.

        Args:
            data_dir: An existing data directory; its catalog and blob store are created
                when missing.
            listen: ``HOST:PORT``; port 0 picks a free port (see :attr:`port`).
            metrics: Counters to update; a fresh set by default.
            config: TLS, tokens, limits and the blob store; defaults otherwise.

        Returns:
            The running server.

        Raises:
            DataDirNotFound: ``data_dir`` does not exist or is not a directory.
            InvalidArgument: ``listen`` is malformed.
            ConfigError: A setting, token file, certificate or key is unusable.
            ListenError: ``listen`` cannot be bound (in use, not a local address).
            CatalogError: The catalog cannot be opened.
            Conflict: ``config.blobs`` is not the store the catalog records, or (shared
                catalog) the grant key is not the one the other replicas sign with.
        """
        config = config if config is not None else ServerConfig()
        config.validate()
        grpclog.install()  # a stream its client cancelled: one line, not a traceback
        address = Address.parse(listen)
        # a replica of a shared catalog keeps only its own files here: made when missing
        layout = DataDir.open(data_dir, create=config.catalog is not None, catalog=config.catalog)
        credentials = config.credentials()
        tokens = TokenFile(config.tokens) if config.tokens is not None else None
        if tokens is not None and credentials is None and not config.insecure:
            raise ConfigError(
                "--tokens without TLS would send every bearer token in cleartext, readable "
                "and replayable by anyone on the path: add --tls-cert/--tls-key, or "
                "--insecure to allow it on a trusted network"
            )
        check_bindable(address)
        grants = None
        if credentials is not None or config.insecure:  # the rule tokens follow
            if config.catalog is not None and config.grant_key is None:
                raise ConfigError(
                    "--catalog with read grants needs --grant-key: every replica must sign "
                    "grants with the same key (strata-hub keygen), or spokes refuse some"
                )
            grants = GrantIssuer.from_file(
                config.grant_key or ensure_grant_key(layout.root), config.grant_lifetime_s
            )
        else:
            logger.info("no read grants without TLS (add --tls-cert/--tls-key, or --insecure)")
        metrics = metrics if metrics is not None else HubMetrics()
        audit = AuditLog(
            config.audit_log or layout.root / "audit.jsonl",
            max_bytes=config.audit_max_bytes,
            backups=config.audit_backups,
        )
        catalog = layout.open_catalog(create=True)
        watcher: CatalogWatcher | None = None
        try:
            store = layout.blob_store(catalog, config.blobs, endpoint_url=config.s3_endpoint)
            if grants is not None and catalog.shared:
                # every replica must sign with one key: the first records it, others compare
                catalog.set_grant_key(grants.key_id, replace=config.rotate_grant_key)
            watcher = CatalogWatcher(catalog, config.poll_s, on_events=metrics.observe_events)
            await watcher.start()
            budget = ReadBudget(
                config.max_streams_per_token,
                config.max_bytes_per_token,
                config.max_bytes_in_flight,
                config.budget_wait_s,
                config.max_block_streams,
                config.stall_timeout_s,
            )
            service = HubService(
                catalog,
                store,
                metrics,
                chunk_bytes=min(CHUNK_BYTES, config.max_message_bytes // 2),
                watcher=watcher,
                audit=audit,
                grants=grants,
                budget=budget,
                grant_limiter=(
                    GrantLimiter(grants.lifetime_s, config.grant_holders_per_token)
                    if grants is not None
                    else None
                ),
                manifest_streams=config.max_manifest_streams,
                watch_streams=config.max_watch_streams,
            )
            server = grpc.aio.server(
                options=server_options(
                    config.max_message_bytes, config.max_connections, config.handshake_timeout_s
                ),
                # the gate first: a call is authenticated before its request is received
                interceptors=[HubGate(tokens, service.refuse, budget), HubWire(MAX_REQUEST_BYTES)],
            )
            hub_pb2_grpc.add_HubServicer_to_server(service, server)
            health_servicer = health.aio.HealthServicer()
            health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
            reflection.enable_server_reflection(
                (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
            )
            try:
                if credentials is None:
                    port = server.add_insecure_port(str(address))
                else:
                    port = server.add_secure_port(str(address), credentials)
            except RuntimeError:
                port = 0
            if port == 0:
                await server.stop(None)
                raise ListenError(f"cannot listen on {listen}: address in use or not available")
            await server.start()
            bulk = None
            if config.bulk_port is not None:
                bulk = BulkServer(
                    tokens,
                    catalog,
                    store,
                    budget,
                    metrics,
                    service.failed,
                    service.count,
                    tls=tls_context(config.tls_cert, config.tls_key, config.client_ca),
                    max_connections=config.bulk_max_connections,
                    handshake_timeout_s=config.handshake_timeout_s,
                )
                try:
                    await bulk.start(address.host, config.bulk_port)
                except ListenError:
                    await server.stop(None)
                    raise
            for name in ("", SERVICE_NAME):
                await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)

            async def reachable(up: bool) -> None:
                metrics.set_catalog_up(up)
                status = (
                    health_pb2.HealthCheckResponse.SERVING
                    if up
                    else health_pb2.HealthCheckResponse.NOT_SERVING
                )
                for name in ("", SERVICE_NAME):
                    await health_servicer.set(name, status)

            watcher.on_reachable = reachable
            unwatch_catalog = metrics.watch_catalog(catalog)
            unwatch_expiry = metrics.watch_expiry(config.tokens, config.tls_cert)

            def unwatch() -> None:
                unwatch_catalog()
                unwatch_expiry()

        except BaseException:
            if watcher is not None:
                await watcher.close()
            catalog.close()
            audit.close()
            raise
        hub = cls(
            server,
            catalog,
            watcher,
            health_servicer,
            Address(address.host, port),
            layout,
            metrics,
            config,
            audit,
        )
        hub._unwatch = unwatch
        hub.bulk = bulk
        hub._trimmer = asyncio.create_task(trim_forever(), name="strata-hub-malloc-trim")
        return hub

    async def stop(self, grace: float | None = GRACE_SECONDS) -> None:
        """Stops gracefully: NOT_SERVING, end Watch streams, drain calls, close.

        Args:
            grace: Seconds calls in flight get to finish before they are cancelled; None
                cancels them at once.
        """
        if self._trimmer is not None:
            self._trimmer.cancel()
        await self._health.enter_graceful_shutdown()
        if self.bulk is not None:
            await self.bulk.close()
        await self._watcher.close()
        await self._server.stop(grace)
        self._unwatch()
        self._catalog.close()
        if self._audit is not None:
            self._audit.close()

    async def wait_for_termination(self) -> None:
        """Waits until the server has stopped."""
        await self._server.wait_for_termination()
