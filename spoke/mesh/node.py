"""The mesh's parts in one daemon: membership, the read grant, the mesh source and the
peer port (and its bulk channel, :mod:`spoke.mesh.peerbulk`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from prometheus_client import REGISTRY

from protocol.address import parse_hostport
from spoke.audit import AuditLog
from spoke.cache.blockcache import BlockCache
from spoke.catalog.catalog import SnapshotCatalog
from spoke.fetch.scheduler import FetchScheduler
from spoke.fetch.source import BlockSource
from spoke.hublink.client import HubClient
from spoke.mesh.admission import Refusals, ScopeCheck
from spoke.mesh.bulkclient import PeerBulkClient
from spoke.mesh.grantcheck import GrantVerifier
from spoke.mesh.grants import GrantKeeper, HubGrantKeys, load_public_key
from spoke.mesh.membership import Membership
from spoke.mesh.peerbulk import PeerBulkServer
from spoke.mesh.peerclient import PeerClient
from spoke.mesh.peerservice import PeerServer, PeerService, start_peer_server
from spoke.mesh.settings import MeshSettings
from spoke.mesh.source import MeshSource
from spoke.mesh.transport import PeerTls, PeerToken

log = logging.getLogger(__name__)

GRANT_AT_START_S = 2.0
"""Longest the daemon's start waits for its first read grant, seconds (then the keeper
keeps asking in the background, and peers are not asked meanwhile)."""


class MeshNode:
    """This spoke as a member of its region's mesh.

    Build it before the scheduler: its :attr:`source` is the fetcher's source, and needs
    nothing of the scheduler (each call carries its blocks' sizes and class). Then
    :meth:`start` it with the scheduler, which its peer port fetches through.

    Args:
        settings: the mesh settings.
        hub: the hub as a source (the fallback of every fetch).
        client: the hub client (read grants and the hub's grant keys).
        catalog: this spoke's catalog (what it may serve, and what it reads).
        audit: where refused peer calls are recorded.

    Raises:
        spoke.hublink.credentials.CredentialError: a certificate, key or token file is unusable.
        spoke.mesh.grants.GrantKeyError: the pinned grant key is unusable.
    """

    def __init__(
        self,
        settings: MeshSettings,
        hub: BlockSource,
        client: HubClient,
        catalog: SnapshotCatalog,
        audit: AuditLog | None = None,
    ) -> None:
        self.settings = settings
        self.catalog = catalog
        self.audit = audit
        self.token = PeerToken(settings.token_file) if settings.token_file else None
        self.tls = (
            PeerTls(settings.cert, settings.key, settings.ca, settings.server_name)
            if settings.cert is not None and settings.key is not None
            else None
        )
        pinned = load_public_key(settings.grant_key) if settings.grant_key else None
        self.keys = HubGrantKeys(client, pinned)
        self.grants = GrantKeeper(client, settings.node, self.keys)
        self.membership = Membership(
            settings.node,
            settings.peers,
            settings.dns,
            connect=lambda node: PeerClient(node, self.token, self.tls, self.grants),
            probe_interval=settings.probe_interval,
            probe_timeout=settings.timeout,
        )
        self.source = MeshSource(
            hub,
            self.membership,
            step_timeout=settings.timeout,
            grants=self.grants,
            scope=catalog.scope,
        )
        self._server: PeerServer | None = None
        self._bulk: PeerBulkServer | None = None
        self._scope: ScopeCheck | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(
        self, scheduler: FetchScheduler, cache: BlockCache, max_connections: int | None = None
    ) -> int:
        """Serve the peer port (and the bulk peer port with ``--peer-bulk-port``), get a
        read grant and probe the peers once (each bounded), and keep both fresh in the
        background.

        Args:
            scheduler: fetches what peers ask for and this spoke misses.
            cache: the block cache.
            max_connections: most peer port connections open at once (default: the
                settings'; the daemon fits it under its open-file limit); with
                ``--peer-bulk-port`` the gRPC and the bulk peer port get half each.

        Returns:
            The peer port bound.

        Raises:
            OSError: the peer port (or ``--peer-bulk-port``) could not be bound.
        """
        if self.settings.insecure:
            log.warning(
                "peer port %s with --peer-insecure: %s; use it only on a trusted network",
                self.settings.listen,
                "plaintext, no region token"
                if self.tls is None and self.token is None
                else "plaintext"
                if self.tls is None
                else "no region token",
            )
        self._scope = ScopeCheck(self.catalog)
        service = PeerService(
            self.settings.node,
            cache,
            scheduler,
            self.source,
            GrantVerifier(self.settings.node, self.keys),
            self._scope,
            token=self.token,
            refusals=Refusals(self.audit),
        )
        connections = max_connections or self.settings.max_connections
        if self.settings.bulk_port:  # the two ports share the cap (and the open files)
            connections = max(8, connections // 2)
        self._server, port = await start_peer_server(
            service, self.settings.listen, self.tls, connections
        )
        if self.settings.bulk_port:  # block bytes between spokes beside gRPC (peerbulk.py)
            self._bulk = PeerBulkServer(service.gate, service.blocks, self.tls, connections)
            host = parse_hostport(self.settings.listen)[0]
            await self._bulk.start(host, self.settings.bulk_port)
            self.source.bulk = PeerBulkClient(
                self.settings.bulk_port, self.token, self.tls, self.grants, cache.store.stage
            )
        try:  # most often the hub answers at once; if not, the keeper keeps asking
            await asyncio.wait_for(self.grants.fetch(), GRANT_AT_START_S)
        except Exception as err:  # the reason is in the keeper's next log line
            log.debug("no read grant at start: %s", err)
        self._tasks.append(asyncio.create_task(self.grants.run()))
        await self.membership.refresh()
        self._tasks.append(asyncio.create_task(self.membership.run()))
        log.info(
            "mesh: node %s, peer port %d%s, %d of %d peers live, grant %s",
            self.settings.node,
            port,
            f", bulk peer port {self._bulk.port}" if self._bulk is not None else "",
            len(self.membership.live),
            len(self.membership.clients),
            "valid" if self.grants.valid else f"missing ({self.grants.problem})",
        )
        return port

    def snapshot(self) -> dict[str, Any]:
        """The mesh's state for ``/v1/cache``: membership, the read grant, traffic by
        source, peer errors."""
        return {**self.membership.snapshot(), "grant": self.grants.snapshot(), **traffic()}

    async def close(self) -> None:
        """Stop probing and refreshing, stop the peer port, close the peers' channels."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._bulk is not None:
            await self._bulk.close()
        if self.source.bulk is not None:
            self.source.bulk.close()
        if self._server is not None:
            await self._server.stop(1.0)
        if self._scope is not None:
            await self._scope.close()
        await self.keys.close()
        await self.membership.close()


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def traffic() -> dict[str, Any]:
    """Bytes, blocks and stream seconds by source, and peer errors, from the metrics.

    ``local`` is what readers found in this spoke's cache (blocks; the mount reads those
    files itself, so their bytes are not seen here) and what it served to its peers.
    """
    sources: dict[str, Any] = {}
    for source in ("hub", "peer"):
        count = _sample("strata_spoke_source_seconds_count", source=source)
        total = _sample("strata_spoke_source_seconds_sum", source=source)
        sources[source] = {
            "bytes": int(_sample("strata_spoke_source_bytes_total", source=source)),
            "blocks": int(_sample("strata_spoke_source_blocks_total", source=source)),
            "streams": int(count),
            "mean_stream_s": round(total / count, 4) if count else None,
        }
    sources["local"] = {
        "blocks": int(_sample("strata_spoke_cache_hits_total")),
        "served_to_peers_bytes": int(
            _sample("strata_spoke_peer_served_bytes_total", how="cache")
            + _sample("strata_spoke_peer_served_bytes_total", how="fetched")
        ),
    }
    kinds = (
        "unavailable",
        "timeout",
        "corrupt",
        "lying",
        "refused",
        "protocol",
        "not_found",
        "permission_denied",
        "resource_exhausted",
    )
    errors = {k: int(_sample("strata_spoke_peer_errors_total", kind=k)) for k in kinds}
    return {
        "sources": sources,
        "routed_blocks": {
            owner: int(_sample("strata_spoke_mesh_routed_blocks_total", owner=owner))
            for owner in ("self", "peer", "relay")
        },
        "relay_blocks": {
            "redirected": int(_sample("strata_spoke_mesh_relay_redirected_blocks_total")),
            "hinted": int(_sample("strata_spoke_mesh_relay_hinted_blocks_total")),
            "received": int(_sample("strata_spoke_mesh_relay_received_blocks_total")),
            "served": int(
                _sample("strata_spoke_mesh_relay_served_blocks_total", how="cache")
                + _sample("strata_spoke_mesh_relay_served_blocks_total", how="fetched")
            ),
        },
        "peer_errors": {k: v for k, v in errors.items() if v},
        "peer_corrupt_blocks": int(_sample("strata_spoke_peer_corrupt_blocks_total")),
        "peer_declined_blocks": int(_sample("strata_spoke_peer_declined_blocks_total")),
    }
