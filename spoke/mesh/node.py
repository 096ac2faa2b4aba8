"""The mesh's parts in one daemon: membership, the mesh source and the peer port."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import grpc.aio
from prometheus_client import REGISTRY

from spoke.cache import BlockCache
from spoke.mesh.membership import Membership
from spoke.mesh.peerclient import PeerClient, PeerTls
from spoke.mesh.peerservice import PeerService, start_peer_server
from spoke.mesh.settings import MeshSettings
from spoke.mesh.source import MeshSource
from spoke.scheduler import FetchScheduler
from spoke.source import BlockSource

log = logging.getLogger(__name__)


class MeshNode:
    """This spoke as a member of its region's mesh.

    Build it before the scheduler (its :attr:`source` is the scheduler's source), then
    :meth:`start` it once the scheduler exists.

    Args:
        settings: the mesh settings.
        hub: the hub as a source (the fallback of every fetch).
    """

    def __init__(self, settings: MeshSettings, hub: BlockSource) -> None:
        self.settings = settings
        token = settings.token
        self.tls = (
            PeerTls(settings.cert, settings.key, settings.ca)
            if settings.cert is not None and settings.key is not None
            else None
        )
        self.membership = Membership(
            settings.node,
            settings.peers,
            settings.dns,
            connect=lambda node: PeerClient(node, token, self.tls),
            probe_interval=settings.probe_interval,
            probe_timeout=settings.timeout,
        )
        self.source = MeshSource(hub, self.membership, step_timeout=settings.timeout)
        self._server: grpc.aio.Server | None = None
        self._prober: asyncio.Task[None] | None = None

    async def start(self, scheduler: FetchScheduler, cache: BlockCache) -> int:
        """Serve the peer port, probe the peers once, and keep probing in the background.

        Returns:
            The peer port bound.

        Raises:
            OSError: the peer port could not be bound.
        """
        self.source.request_of = scheduler.request_of
        service = PeerService(
            self.settings.node, cache, scheduler, self.source, token=self.settings.token
        )
        self._server, port = await start_peer_server(service, self.settings.listen, self.tls)
        await self.membership.refresh()
        self._prober = asyncio.create_task(self.membership.run())
        log.info(
            "mesh: node %s, peer port %d, %d of %d peers live",
            self.settings.node,
            port,
            len(self.membership.live),
            len(self.membership.clients),
        )
        return port

    def snapshot(self) -> dict[str, Any]:
        """The mesh's state for ``/v1/cache``: membership, traffic by source, peer errors."""
        return {**self.membership.snapshot(), **traffic()}

    async def close(self) -> None:
        """Stop probing, stop the peer port, close the peers' channels."""
        if self._prober is not None:
            self._prober.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._prober
        if self._server is not None:
            await self._server.stop(1.0)
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
    kinds = ("unavailable", "timeout", "corrupt", "refused", "protocol", "not_found")
    errors = {k: int(_sample("strata_spoke_peer_errors_total", kind=k)) for k in kinds}
    return {
        "sources": sources,
        "routed_blocks": {
            owner: int(_sample("strata_spoke_mesh_routed_blocks_total", owner=owner))
            for owner in ("self", "peer")
        },
        "peer_errors": {k: v for k, v in errors.items() if v},
        "peer_corrupt_blocks": int(_sample("strata_spoke_peer_corrupt_blocks_total")),
    }
