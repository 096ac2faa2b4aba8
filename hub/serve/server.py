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
from collections.abc import Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc  # type: ignore[import-untyped]
from grpc_reflection.v1alpha import reflection  # type: ignore[import-untyped]

from hub.audit import AuditLog
from hub.auth.grants import (
    GrantIssuer,
    GrantLimiter,
    ensure_grant_key,
)
from hub.auth.tokens import TokenFile
from hub.catalog import Catalog
from hub.errors import ConfigError, ListenError
from hub.limits.budget import (
    ReadBudget,
)
from hub.serve.address import Address
from hub.serve.bulk import BulkServer
from hub.serve.bulksocket import tls_context
from hub.serve.config import ServerConfig, check_bindable, server_options
from hub.serve.gate import HubGate
from hub.serve.metrics import HubMetrics
from hub.serve.service import HubService
from hub.serve.watch import CatalogWatcher
from hub.serve.wire import CHUNK_BYTES, MAX_REQUEST_BYTES, SERVICE_NAME, HubWire
from hub.store.datadir import DataDir
from protocol.hub.v1 import hub_pb2_grpc
from strata_local import grpclog
from strata_local.door import Door
from strata_local.knownhosts import KnownHosts
from strata_local.memory import trim_forever

logger = logging.getLogger(__name__)

KNOWN_CALLERS_FILE = "known-callers.json"
"""The data directory's file of who proved a token from which address lately
(:mod:`strata_local.knownhosts`): read as the hub starts, written every 30 s and as it
stops."""

GRACE_SECONDS = 5.0
"""How long :meth:`HubServer.stop` lets calls in flight finish, seconds."""


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
        self._known: KnownHosts | None = None
        self._known_saver: asyncio.Task[None] | None = None
        self.bulk: BulkServer | None = None
        self.door: Door | None = None

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
        door: Door | None = None
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
            # the door holds the port's connection slots (shares by address, connections
            # that carried an accepted token kept) and relays to gRPC on a private socket
            mtls = credentials is not None and config.client_ca is not None
            # who proved a token from where lately, across a restart: a returning fleet's
            # handshakes go first under a flood from new addresses (both ports)
            known = KnownHosts()
            if known.load(layout.root / KNOWN_CALLERS_FILE):
                logger.info("%d known callers read from the data directory", len(known))
            metrics.known_callers.set_function(lambda: len(known))
            door = Door(
                config.max_connections,
                tokens is not None or mtls,
                config.handshake_timeout_s,
                known,
            )
            try:
                port = await door.start(address.host, address.port)
            except OSError as err:
                await door.close()
                raise ListenError(f"cannot listen on {listen}: {err.strerror or err}") from err
            service.who = door.who
            metrics.handshakes_waiting.labels("grpc").set_function(lambda: door.turns.waiting)
            metrics.handshake_rate.labels("grpc").set_function(lambda: door.turns.rate)
            server = grpc.aio.server(
                options=server_options(
                    config.max_message_bytes,
                    2 * config.max_connections,  # the door's cap is the one that counts
                    config.handshake_timeout_s,
                ),
                # the gate first: a call is authenticated before its request is received
                interceptors=[
                    HubGate(tokens, service.refuse, budget, prove=door.prove, unprove=door.unprove),
                    HubWire(MAX_REQUEST_BYTES),
                ],
            )
            hub_pb2_grpc.add_HubServicer_to_server(service, server)
            health_servicer = health.aio.HealthServicer()
            health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
            reflection.enable_server_reflection(
                (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
            )
            try:
                if credentials is None:
                    bound = server.add_insecure_port(door.backend)
                else:
                    bound = server.add_secure_port(door.backend, credentials)
            except RuntimeError:
                bound = 0
            if bound == 0:
                await server.stop(None)
                await door.close()
                raise ListenError(f"cannot listen on the door's socket {door.backend}")
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
                    known=known,
                )
                try:
                    await bulk.start(address.host, config.bulk_port)
                except ListenError:
                    await server.stop(None)
                    await door.close()
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
            if door is not None:
                await door.close()  # idempotent
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
        hub.door = door
        hub._known = known
        hub._trimmer = asyncio.create_task(trim_forever(), name="strata-hub-malloc-trim")
        hub._known_saver = asyncio.create_task(
            known.save_every(layout.root / KNOWN_CALLERS_FILE), name="strata-hub-known-callers"
        )
        return hub

    async def stop(self, grace: float | None = GRACE_SECONDS) -> None:
        """Stops gracefully: NOT_SERVING, end Watch streams, drain calls, close.

        Args:
            grace: Seconds calls in flight get to finish before they are cancelled; None
                cancels them at once.
        """
        for task in (self._trimmer, self._known_saver):
            if task is not None:
                task.cancel()
        await self._health.enter_graceful_shutdown()
        if self.bulk is not None:
            await self.bulk.close()
        await self._watcher.close()
        await self._server.stop(grace)
        if self.door is not None:
            await self.door.close()
        if self._known_saver is not None:  # a write under way finishes before the last
            await asyncio.gather(self._known_saver, return_exceptions=True)
        if self._known is not None:
            try:
                self._known.save(self.data_dir.root / KNOWN_CALLERS_FILE)
            except OSError as err:
                logger.warning("known callers not saved: %s", err)
        self._unwatch()
        self._catalog.close()
        if self._audit is not None:
            self._audit.close()

    async def wait_for_termination(self) -> None:
        """Waits until the server has stopped."""
        await self._server.wait_for_termination()
