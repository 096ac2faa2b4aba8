"""The spoke daemon's composition root: builds every component, serves until a signal,
and shuts down in the reverse order (an AsyncExitStack).

Serves the local gRPC service for the mount (UNIX socket in the cache dir), the admin API
(HTTP on ``--admin``) and, with ``--metrics``, its ``/metrics``, ``/healthz`` and
``/readyz`` alone on a second address (no token, no ``/v1/``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Sequence
from pathlib import Path

import grpc
import grpc.aio

from protocol.spoke.v1 import spoke_pb2_grpc
from spoke import metrics
from spoke.audit import AuditLog
from spoke.cache.blockcache import BlockCache
from spoke.cache.hinted import HintedPolicy
from spoke.cache.registry import make_policy
from spoke.cache.store import BlockStore, open_index
from spoke.cache.tenants import TenantShares
from spoke.catalog.catalog import SnapshotCatalog
from spoke.catalog.snapshots import SnapshotIndex
from spoke.disk.encryption import check_cache_key
from spoke.disk.hardening import (
    ensure_admin_token,
    private_socket_dir,
    private_umask,
    secure_cache_dir,
)
from spoke.disk.layout import CacheLayout
from spoke.errors import HubUnavailable
from spoke.fetch.fetcher import Fetcher
from spoke.fetch.scheduler import FetchScheduler
from spoke.fetch.source import BlockSource
from spoke.hublink.bulk import BulkSource
from spoke.hublink.client import HubClient
from spoke.hublink.source import HubSource
from spoke.mesh.node import MeshNode
from spoke.prefetch.fill import BackgroundFill
from spoke.prefetch.hints import HintService
from spoke.prefetch.prewarm import PrewarmJobs
from spoke.run import lock
from spoke.run.settings import SpokeSettings
from spoke.serve.access import AccessLog, SteadyState
from spoke.serve.admin import create_app, create_metrics_app
from spoke.serve.adminguard import AdminGuard
from spoke.serve.adminserver import (
    AdminServer,
    admin_config,
    bind,
    install_log_limits,
    quiet_accept_errors,
)
from spoke.serve.admintokens import ScopedTokens
from spoke.serve.frontdoor import PeerCheckedSocket
from spoke.serve.limits import ConnectionCaps, raise_open_files
from spoke.serve.local import SpokeLocalService
from spoke.upkeep.invalidation import Invalidator
from spoke.upkeep.pins import PinRegistry
from spoke.upkeep.retention import ReadClock, Retention
from strata_local.atomic import write_atomic

log = logging.getLogger(__name__)

LOCAL_MESSAGE_BYTES = 256 << 20  # streamed-through blocks travel inline to the mount
METRICS_MAX_CONNECTIONS = 32  # --metrics: Prometheus and the kubelet's probes, a few each


async def run_daemon(settings: SpokeSettings, stop: asyncio.Event | None = None) -> None:
    """Run the daemon until SIGINT/SIGTERM (or ``stop`` is set).

    Raises:
        OSError: the admin address or the socket could not be bound.
        spoke.disk.encryption.EncryptionError: the cache dir was written with another
            encryption key (or with one, and none is given).
        spoke.run.lock.CacheInUse: another daemon uses the cache directory.
        spoke.disk.hardening.UnsafeDirectory: the cache directory is one another user could
            change (:func:`spoke.disk.hardening.secure_cache_dir`), or the gRPC socket's private
            directory is a link or another user's.
    """
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)

    quiet_accept_errors(loop)  # no traceback per pending connection when fds run out
    install_log_limits()
    caps = ConnectionCaps.fit(  # the caps on connections from others, under the fd limit
        raise_open_files(), settings.mesh.max_connections if settings.mesh else 0
    )

    layout = CacheLayout(settings.cache_dir)
    private_umask()  # 0700 directories, 0600 files and socket, whatever the caller's umask
    layout.root.mkdir(parents=True, exist_ok=True)
    # before anything is read or written there: refuse a directory another user could
    # change, narrow what an older version or another umask left behind
    secure_cache_dir(layout)
    owner = lock.hold(layout.daemon_lock, "spoke daemon")
    metrics.MOUNT_RESTARTS.path = layout.mount_restarts_file
    if settings.hub_cert is not None:  # when they expire, read at each scrape
        metrics.CERTIFICATES.paths["hub-client"] = settings.hub_cert
    if settings.mesh is not None and settings.mesh.cert is not None:
        metrics.CERTIFICATES.paths["peer"] = settings.mesh.cert
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(os.close, owner)
        private_socket_dir(layout.private_dir)  # gRPC's own socket: gRPC cannot check peers
        audit = AuditLog(
            settings.audit_log or layout.root / "audit.jsonl",
            max_bytes=int(settings.audit_max_bytes),
            backups=settings.audit_backups,
        )
        stack.callback(audit.close)
        cipher = settings.block_cipher()  # encryption at rest (spoke/disk/encryption.py)
        check_cache_key(layout, cipher, settings.encryption_key_file, record=True)
        env = open_index(layout)
        stack.callback(env.close)
        cache = BlockCache(
            BlockStore(layout, env, cipher),
            # the configured policy until a job posts hints; per hint stream, the
            # blocks of the last 2 reads are still being read (DESIGN.md: Hints).
            # The cache sizes its policy: --cache-size has one owner
            HintedPolicy(make_policy(settings.policy), in_use=2),
            int(settings.cache_size),
            high_watermark=settings.high_watermark,
            low_watermark=settings.low_watermark,
        )
        stack.callback(cache.flush_recency)  # before the index closes
        hub = HubClient(settings.hub, credentials=settings.hub_credentials())
        stack.push_async_callback(hub.close)
        catalog = SnapshotCatalog(hub, env, settings.publisher())
        stack.push_async_callback(catalog.close)
        source: BlockSource = HubSource(hub)
        if settings.hub_bulk_port is not None:  # block bytes beside gRPC (hublink/bulk.py)
            bulk = BulkSource(
                hub, settings.hub_bulk_port, settings.fetch_workers, stage=cache.store.stage
            )
            stack.callback(bulk.close)
            source = bulk
            log.info(
                "block bytes over the hub's bulk channel %s, %d fetch workers",
                bulk.address,
                settings.fetch_workers,
            )
            unreachable = await asyncio.to_thread(bulk.probe)
            if unreachable is not None:
                log.error(
                    "the hub's bulk channel is unreachable (%s): block fetches fail until it "
                    "answers; check --hub-bulk-port against the hub's serve --bulk-port",
                    unreachable,
                )
        mesh = (
            MeshNode(settings.mesh, source, hub, catalog, audit)
            if settings.mesh is not None
            else None
        )
        scheduler = FetchScheduler(
            Fetcher(mesh.source if mesh else source, miss_deadline=settings.miss_deadline),
            cache,
        )
        stack.push_async_callback(scheduler.close)
        if settings.tenants is not None:  # tenants' shares of the cache and the link
            tenants = TenantShares(
                settings.tenants, int(settings.cache_size), catalog.scope.datasets_of
            )
            cache.share_with(tenants)
            scheduler.share_link(tenants)
            log.info("tenants' shares from %s: %s", settings.tenants, ", ".join(tenants.tenants()))
        if mesh is not None:  # the region's spokes before the hub (spoke/mesh/)
            await mesh.start(scheduler, cache, caps.peer)
            stack.push_async_callback(mesh.close)
        hints = HintService(cache, scheduler)
        pins = PinRegistry(env, cache)
        index = SnapshotIndex()
        access = AccessLog()  # every read the mount reports goes, in this order, to:

        def policy(digests: Sequence[str], hit: bool) -> None:
            if hit:  # a miss reaches the policy when its block is admitted
                cache.record_access(digests)

        access.subscribe("policy", policy)
        access.subscribe("hints", hints.observe)
        access.subscribe("ledger", scheduler.observe)
        if cache.tenants is not None:
            access.subscribe("tenants", cache.tenants.reads)
        fill = BackgroundFill(
            index,
            scheduler,
            cache,
            mode=settings.background_fill,
            rate_bps=float(settings.fill_rate) if settings.fill_rate is not None else None,
            share=settings.fill_share,
            paused=lambda: hints.policy.active,
        )
        access.subscribe("fill", fill.observe)
        log.info("%s", fill.describe())
        access.subscribe("steady state", SteadyState().observe)
        retention_s = settings.retention_seconds()
        # retention: when each block was last read (persisted in the index with --retention)
        clock = ReadClock(env=env if retention_s is not None else None)
        stack.callback(clock.flush)  # on the way out, before the index closes
        access.subscribe("retention", lambda digests, hit: clock.read(list(digests)))
        background = [
            asyncio.create_task(cache.run_evictor()),
            asyncio.create_task(Invalidator(hub, catalog, cache, pins).run()),
            asyncio.create_task(fill.run()),
        ]
        if retention_s is not None:
            retention = Retention(catalog, cache, clock, retention_s, audit)
            background.append(asyncio.create_task(retention.run()))

        async def stop_background() -> None:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)

        stack.push_async_callback(stop_background)

        admin_sock = bind(settings.admin)
        stack.callback(admin_sock.close)
        metrics_sock = bind(settings.metrics) if settings.metrics else None
        if metrics_sock is not None:
            stack.callback(metrics_sock.close)

        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", LOCAL_MESSAGE_BYTES),
                ("grpc.max_send_message_length", LOCAL_MESSAGE_BYTES),
            ]
        )
        spoke_pb2_grpc.add_SpokeLocalServicer_to_server(  # type: ignore[no-untyped-call]
            SpokeLocalService(catalog, cache, scheduler, access, hints, index), server
        )
        backend = layout.grpc_socket_path  # private (see above); the mount dials the front door
        backend.unlink(missing_ok=True)
        (layout.root / ".grpc.sock").unlink(missing_ok=True)  # where older daemons listened
        layout.daemon_pid_file.write_text(f"{os.getpid()}\n")
        stack.callback(layout.daemon_pid_file.unlink, missing_ok=True)
        server.add_insecure_port(f"unix:{backend}")
        await server.start()
        os.chmod(backend, 0o600)
        stack.push_async_callback(server.stop, 2.0)
        front = PeerCheckedSocket(layout.socket_path, backend, audit)  # own uid and root only
        stack.callback(front.close)

        jobs = PrewarmJobs(catalog, cache, scheduler, pins)
        stack.push_async_callback(jobs.close)
        token: str | None
        if settings.admin_token_file is not None:
            token = settings.admin_token_file.read_text().strip()
        elif settings.no_admin_token:
            token = None
            log.warning("admin API without a token (--no-admin-token): any local user may use it")
        else:
            token = ensure_admin_token(layout)
        app = create_app(
            cache,
            scheduler,
            catalog,
            jobs,
            pins,
            hints=hints,
            mount=settings.mount,
            fill=fill,
            mesh=mesh.snapshot if mesh is not None else None,
        )
        scoped = (
            ScopedTokens(settings.admin_scoped_tokens)
            if settings.admin_scoped_tokens is not None
            else None
        )
        guarded = AdminGuard(app, token, audit, scoped=scoped)
        admin = AdminServer(admin_config(guarded, caps.admin))
        admin_task = asyncio.create_task(admin.serve(sockets=[admin_sock]))

        async def stop_admin() -> None:
            admin.should_exit = True
            await admin_task

        stack.push_async_callback(stop_admin)
        if metrics_sock is not None:  # --metrics: health and metrics only, no token
            metrics_app = create_metrics_app(app)
            metrics_server = AdminServer(admin_config(metrics_app, METRICS_MAX_CONNECTIONS))
            metrics_task = asyncio.create_task(metrics_server.serve(sockets=[metrics_sock]))

            async def stop_metrics() -> None:
                metrics_server.should_exit = True
                await metrics_task

            stack.push_async_callback(stop_metrics)
        host, port = admin_sock.getsockname()[:2]
        url = f"http://{host}:{port}"
        write_atomic(layout.admin_url_file, (url + "\n").encode())
        stack.callback(_unlink_if_ours, layout.admin_url_file, url)

        try:
            found = await catalog.list_datasets()
            log.info("hub %s reachable: %d datasets", settings.hub, len(found.datasets))
        except HubUnavailable as err:
            metrics.HUB_UP.set(0)
            if hub.refused is None:  # a refusal was logged as an error by the client
                log.warning("%s; serving cached data and retrying", err)
        log.info("daemon ready: socket %s, admin %s", layout.socket_path, url)
        await stop.wait()
        log.info("daemon stopping")


def _unlink_if_ours(path: Path, url: str) -> None:
    """Remove ``admin.url`` at exit only while it still names this daemon's ``url``: after
    a succession the successor's daemon may have written its own there already, and a
    predecessor stopping late must not take it away (make test saw a successor's
    supervisor find no ``admin.url``)."""
    with contextlib.suppress(OSError):
        if path.read_text().strip() == url:
            path.unlink()
