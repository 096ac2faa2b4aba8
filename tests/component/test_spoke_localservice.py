"""The local service over a real cache, scheduler and access log, with a fake hub: reads
reach every access-log subscriber once, misses are fetched as demand, manifests are
indexed for cross-file readahead, bad digests are INVALID_ARGUMENT."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import grpc
import pytest

from protocol.hub.v1 import hub_pb2
from protocol.spoke.v1 import spoke_pb2
from spoke import metrics
from spoke.cache.blockcache import BlockCache
from spoke.cache.lru import LRUPolicy
from spoke.cache.store import BlockStore, open_index
from spoke.catalog.catalog import SnapshotCatalog
from spoke.catalog.snapshots import SnapshotIndex
from spoke.disk.layout import CacheLayout, block_digest
from spoke.fetch.fetcher import Fetcher
from spoke.fetch.priority import Source
from spoke.fetch.scheduler import FetchScheduler
from spoke.serve.access import AccessLog, SteadyState
from spoke.serve.local import SpokeLocalService
from tests.component.block_source import DictSource

FILES = 40


class Catalog:
    def __init__(self, entries: list[hub_pb2.ManifestEntry]) -> None:
        self.entries = entries

    async def manifest(
        self, dataset: str, ref: str, stale_ok: bool = False
    ) -> list[hub_pb2.ManifestEntry]:
        return self.entries


class Aborted(Exception):
    pass


class Context:
    code: grpc.StatusCode | None = None

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.code = code
        raise Aborted(details)


class Service:
    def __init__(self, root: Path) -> None:
        self.data = [i.to_bytes(4, "big") * 1024 for i in range(FILES)]
        self.refs = [(block_digest(b), len(b)) for b in self.data]
        self.entries = [
            hub_pb2.ManifestEntry(
                path=f"c/{i:03d}",
                type=hub_pb2.ENTRY_TYPE_FILE,
                size=len(b),
                blocks=[hub_pb2.BlockRef(digest=d, size=n)],
            )
            for i, (b, (d, n)) in enumerate(zip(self.data, self.refs, strict=True))
        ]
        layout = CacheLayout(root)
        self.cache = BlockCache(BlockStore(layout, open_index(layout)), LRUPolicy(1 << 30), 1 << 30)
        self.hub = DictSource(
            {d: b for (d, _), b in zip(self.refs, self.data, strict=True)}, delay=0.005
        )
        self.scheduler = FetchScheduler(Fetcher(self.hub), self.cache)
        self.access = AccessLog()
        self.heard: list[tuple[list[str], bool]] = []
        self.access.subscribe("test", lambda d, hit: self.heard.append((list(d), hit)))
        index = SnapshotIndex()
        self.local = SpokeLocalService(
            cast(SnapshotCatalog, Catalog(self.entries)),
            self.cache,
            self.scheduler,
            self.access,
            index=index,
        )

    async def ensure(self, i: int) -> spoke_pb2.EnsureBlocksResponse:
        d, n = self.refs[i]
        request = spoke_pb2.EnsureBlocksRequest(blocks=[hub_pb2.BlockRef(digest=d, size=n)])
        reply: spoke_pb2.EnsureBlocksResponse = await self.local.EnsureBlocks(request, Context())
        return reply

    async def manifest(self) -> list[Any]:
        request = hub_pb2.GetManifestRequest(dataset="d", ref="v1")
        return [page async for page in self.local.GetManifest(request, Context())]

    async def settle(self) -> None:
        while self.scheduler.inflight:
            await asyncio.sleep(0.005)


def test_reads_are_recorded_once_hits_and_misses(tmp_path: Path) -> None:
    s = Service(tmp_path)
    hits0, misses0 = metrics.CACHE_HITS._value.get(), metrics.CACHE_MISSES._value.get()

    async def go() -> None:
        reply = await s.ensure(0)
        assert list(reply.was_cached) == [False]
        await s.local.RecordAccess(spoke_pb2.RecordAccessRequest(digests=[s.refs[0][0]]), Context())
        reply = await s.ensure(0)
        assert list(reply.was_cached) == [True]

    asyncio.run(go())
    d0 = s.refs[0][0]
    assert s.heard == [([d0], False), ([d0], True), ([d0], True)]
    assert metrics.CACHE_MISSES._value.get() - misses0 == 1
    assert metrics.CACHE_HITS._value.get() - hits0 == 2
    assert s.hub.fetched == [d0]


def test_the_daemon_guesses_nothing_and_the_mounts_prefetches_keep_their_source(
    tmp_path: Path,
) -> None:
    """Walks are detected in the mount, per reader (fusemount/crossfile.py): misses
    arriving in manifest order start nothing here. A Prefetch is its source's in the
    ledger; an unknown source is INVALID_ARGUMENT."""
    s = Service(tmp_path)
    context = Context()

    async def go() -> int:
        await s.manifest()
        misses = 0
        for i in range(8):
            reply = await s.ensure(i)
            misses += not reply.was_cached[0]
            await s.settle()
        blocks = [hub_pb2.BlockRef(digest=d, size=n) for d, n in s.refs[8:11]]
        request = spoke_pb2.PrefetchRequest(
            blocks=blocks, source=spoke_pb2.PREFETCH_SOURCE_CROSSFILE
        )
        reply = await s.local.Prefetch(request, context)
        assert reply.started == 3
        assert reply.HasField("room_bytes")  # what the mount may ask for next
        assert reply.room_bytes == s.scheduler.readahead_room(Source.CROSSFILE) > 0
        await s.settle()
        with pytest.raises(Aborted, match="unknown prefetch source"):
            await s.local.Prefetch(
                spoke_pb2.PrefetchRequest(blocks=blocks, source=7),  # type: ignore[arg-type]
                context,
            )
        return misses

    assert asyncio.run(go()) == 8  # every read of the walk was a miss: no daemon-side guess
    assert s.hub.fetched == [d for d, _ in s.refs[:11]]
    ledger = s.scheduler.ledger.snapshot()
    assert ledger["crossfile"]["issued_bytes"] == sum(n for _, n in s.refs[8:11])
    assert ledger["readahead"]["issued_bytes"] == 0
    assert context.code == grpc.StatusCode.INVALID_ARGUMENT


def test_malformed_digests_are_invalid_argument(tmp_path: Path) -> None:
    s = Service(tmp_path)
    context = Context()
    request = spoke_pb2.EnsureBlocksRequest(blocks=[hub_pb2.BlockRef(digest="zz", size=1)])

    async def go() -> None:
        with pytest.raises(Aborted, match="malformed block digest"):
            await s.local.EnsureBlocks(request, context)
        with pytest.raises(Aborted):
            await s.local.Prefetch(
                spoke_pb2.PrefetchRequest(blocks=[hub_pb2.BlockRef(digest="zz", size=1)]),
                context,
            )

    asyncio.run(go())
    assert context.code == grpc.StatusCode.INVALID_ARGUMENT
    assert s.heard == []


def test_time_to_steady_state() -> None:
    now = [0.0]
    steady = SteadyState(window_s=5.0, miss_fraction=0.01, clock=lambda: now[0])
    for second in range(30):
        now[0] = float(second)
        hit = second >= 12  # misses for the first 12 s, then only hits
        steady.observe(["a" * 32] * 10, hit)
    # windows start at 0, 5, 10, 15: the one from 15 s is the first with no misses
    assert steady.seconds == 15.0
    for second in range(30, 40):  # a new cold phase: a window of misses again
        now[0] = float(second)
        steady.observe(["b" * 32] * 10, second >= 36)
    assert steady.seconds is None


def test_failed_reads_the_mount_tells_are_counted(tmp_path: Path) -> None:
    s = Service(tmp_path)
    before = metrics.READ_ERRORS._value.get()

    async def go() -> None:
        await s.local.RecordAccess(spoke_pb2.RecordAccessRequest(read_errors=3), Context())

    asyncio.run(go())
    assert metrics.READ_ERRORS._value.get() - before == 3
    assert s.heard == []  # no digests: no reads recorded
