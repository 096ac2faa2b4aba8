"""Invalidation: follow the hub's catalog events and act on them.

The daemon keeps one ``Watch`` stream open, resuming from the last sequence it applied
(persisted in the index) after every disconnect, so no event is missed. On a published
version or a moved or removed tag it drops its stored answers about that dataset (the next
question goes to the hub); on a revoked version it also remembers the revocation (the
version stops resolving here, even with the hub down) and purges the cached blocks that no
other stored, live snapshot shares, after removing the pins of that version (a pin never
keeps revoked bytes). The mount sees the changes through its one-second
listing refreshes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os

import grpc
import grpc.aio

from protocol.hub.v1 import hub_pb2
from spoke import metrics
from spoke.cache.blockcache import BlockCache
from spoke.catalog.catalog import SnapshotCatalog
from spoke.catalog.selection import unique_blocks
from spoke.errors import SpokeError
from spoke.hublink.client import HubClient
from spoke.upkeep.pins import PinRegistry

log = logging.getLogger(__name__)

RETRY_MAX = 5.0  # seconds between reconnection attempts, at most


class Invalidator:
    """Applies the hub's catalog events to the spoke's catalog and cache."""

    def __init__(
        self,
        hub: HubClient,
        catalog: SnapshotCatalog,
        cache: BlockCache,
        pins: PinRegistry | None = None,
    ) -> None:
        self.hub = hub
        self.catalog = catalog
        self.cache = cache
        self.pins = pins
        self.sequence = catalog.get_sequence()

    async def run(self) -> None:
        """Follow the event stream forever, reconnecting with backoff."""
        delay = 0.2
        while True:
            try:
                async for event in self.hub.watch(self.sequence):
                    await self.apply(event)
                    delay = 0.2
            except grpc.aio.AioRpcError as err:
                if err.code() == grpc.StatusCode.OUT_OF_RANGE:
                    log.warning(
                        "catalog events after %d are gone (%s); resynchronising",
                        self.sequence,
                        err.details(),
                    )
                    self.resync()
                    continue
                if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                    log.warning("hub %s has no Watch; invalidation is off", self.hub.target)
                    return
                log.debug("watch stream broke (%s); reconnecting", err.code().name)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX)

    def resync(self) -> None:
        """Forget every stored answer about versions and tags; start over from sequence 0."""
        self.catalog.forget_refs()
        self.sequence = 0
        self.catalog.set_sequence(0)

    async def apply(self, event: hub_pb2.CatalogEvent) -> None:
        """Act on one event and record its sequence."""
        self.catalog.forget_refs(event.dataset)
        if event.kind == hub_pb2.EVENT_KIND_VERSION_REVOKED:
            self.catalog.mark_revoked(event.dataset, event.version, event.snapshot_id)
            self.unpin(event.dataset, event.version)
            purged = await self.purge(event.dataset, event.snapshot_id)
            log.info("%s %s revoked: %d cached blocks purged", event.dataset, event.version, purged)
        self.sequence = event.sequence
        self.catalog.set_sequence(event.sequence)
        metrics.WATCH_SEQUENCE.set(event.sequence)

    def unpin(self, dataset: str, version: str) -> int:
        """Remove every pin of a revoked version; returns how many."""
        if self.pins is None:
            return 0
        doomed = [p for p in self.pins.all() if p.dataset == dataset and p.version == version]
        for pin in doomed:
            self.pins.remove(pin.id)
        if doomed:
            log.info("%s %s revoked: %d pins removed", dataset, version, len(doomed))
        return len(doomed)

    async def purge(self, dataset: str, snapshot_id: str) -> int:
        """Drop cached blocks of a revoked snapshot that no live snapshot stored here uses.

        A live version of the same dataset with the same snapshot id (an identical tree)
        keeps everything.
        """
        with contextlib.suppress(SpokeError):
            live = await self.catalog.list_versions(dataset)
            if any(v.snapshot_id == snapshot_id for v in live.versions):
                return 0
        revoked = self.catalog.revoked_snapshots()
        doomed = unique_blocks(self.catalog.stored_manifest(snapshot_id))
        for other in self.catalog.stored_snapshots():
            if other not in revoked and doomed:
                for digest in unique_blocks(self.catalog.stored_manifest(other)):
                    doomed.pop(digest, None)
        return sum(self._empty_and_drop(digest) for digest in doomed)

    def _empty_and_drop(self, digest: str) -> bool:
        """Truncate a purged block's file to 0 bytes, then drop it.

        A file the mount opened in FUSE passthrough mode is read by the kernel from the
        block file itself, which it holds open: unlinking alone would let such a reader of
        the revoked version go on reading (until the mount notices the revocation and
        empties it too). Emptied first, it reads end-of-file at once.
        """
        with contextlib.suppress(OSError):  # already gone: nothing reads it
            os.truncate(self.cache.store.layout.block_path(digest), 0)
        return self.cache.drop(digest)
