"""Background fill over a real cache and scheduler with a fake hub: it fills a snapshot
being read, waits while paused, stops (and says why) when the cache has no room instead of
evicting, skips snapshots too large for its share, survives a link cut, and stays off when
told."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from protocol.hub.v1 import hub_pb2
from spoke import metrics
from spoke.cache.blockcache import BlockCache
from spoke.cache.lru import LRUPolicy
from spoke.cache.store import BlockStore, open_index
from spoke.catalog.snapshots import SnapshotIndex
from spoke.disk.layout import CacheLayout, block_digest
from spoke.fetch.fetcher import Fetcher
from spoke.fetch.scheduler import FetchScheduler, Priority
from spoke.prefetch.fill import BackgroundFill, FillMode
from tests.component.block_source import DictSource
from tests.support import eventually_async

BLOCK = 4096
FILES = 24


class Wake(asyncio.Event):
    """The fill loop's wake-up event, telling whether the loop is waiting on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = 0

    async def wait(self) -> bool:  # type: ignore[override]
        self.waiting += 1
        try:
            return await super().wait()
        finally:
            self.waiting -= 1


class Setup:
    def __init__(
        self,
        root: Path,
        capacity: int = 1 << 30,
        mode: FillMode = "auto",
        paused: Callable[[], bool] = lambda: False,
        miss_deadline: float = 60.0,
    ) -> None:
        data = [i.to_bytes(4, "big") * (BLOCK // 4) for i in range(FILES)]
        self.refs = [(block_digest(b), len(b)) for b in data]
        entries = [
            hub_pb2.ManifestEntry(
                path=f"c/{i}",
                type=hub_pb2.ENTRY_TYPE_FILE,
                size=n,
                blocks=[hub_pb2.BlockRef(digest=d, size=n)],
            )
            for i, (d, n) in enumerate(self.refs)
        ]
        layout = CacheLayout(root)
        self.cache = BlockCache(
            BlockStore(layout, open_index(layout)), LRUPolicy(capacity), capacity
        )
        self.hub = DictSource(
            {d: b for (d, _), b in zip(self.refs, data, strict=True)}, delay=0.002
        )
        self.scheduler = FetchScheduler(
            Fetcher(self.hub, miss_deadline=miss_deadline),  # type: ignore[arg-type]
            self.cache,
        )
        index = SnapshotIndex()
        index.learn("ds@v1", entries)
        self.fill = BackgroundFill(
            index, self.scheduler, self.cache, mode=mode, paused=paused, recheck_s=0.05
        )
        self.wake = self.fill._wake = Wake()

    def state(self) -> str:
        return str(self.fill.fills["ds@v1"].state)

    async def until(self, state: str, timeout: float = 10.0) -> None:
        await eventually_async(
            lambda: "ds@v1" in self.fill.fills and self.state() == state,
            f"fill state {state!r}",
            timeout,
        )

    async def parked(self) -> None:
        """Until the fill loop has looked at what it was told and waits for a wake-up
        with none pending, and nothing is queued or on the wire: had it started a fetch,
        the scheduler would hold it now."""
        await eventually_async(
            lambda: self.wake.waiting and not self.wake.is_set(), "the fill loop waiting"
        )
        assert self.scheduler.inflight == 0

    async def looked_again(self) -> None:
        """Until a pass of the fill that began after this call has ended (the one running
        now may have read the cache before the caller's last change)."""
        ended = self.fill.fills["ds@v1"].passes
        await eventually_async(
            lambda: self.fill.fills["ds@v1"].passes >= ended + 2, "the fill's next pass"
        )


def test_a_snapshot_being_read_is_filled_completely(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    filled0 = metrics.FILL_BYTES._value.get()

    async def go() -> None:
        runner = asyncio.create_task(s.fill.run())
        await s.scheduler.ensure(s.refs[:1])  # a reader misses one block...
        s.fill.observe([s.refs[0][0]], hit=False)  # ...and the access log says so
        await s.until("done")
        runner.cancel()
        await s.scheduler.close()

    asyncio.run(go())
    assert all(s.cache.contains(d) for d, _ in s.refs)
    assert sorted(s.hub.fetched) == sorted(d for d, _ in s.refs)  # each block once
    public = s.fill.fills["ds@v1"].public()
    assert public["bytes_filled"] == (FILES - 1) * BLOCK  # the one read was not fill's
    assert public["bytes_remaining"] == 0
    assert metrics.FILL_BYTES._value.get() - filled0 == (FILES - 1) * BLOCK
    assert metrics.FILL_REMAINING_BYTES._value.get() == 0


def test_fill_waits_while_paused_then_resumes(tmp_path: Path) -> None:
    paused = [True]
    s = Setup(tmp_path, paused=lambda: paused[0])

    async def go() -> None:
        runner = asyncio.create_task(s.fill.run())
        s.fill.observe([s.refs[3][0]], hit=True)
        await s.until("waiting")
        await s.looked_again()  # a whole pass after it first waited: still no fetch
        assert s.hub.fetched == []
        assert "hint" in s.fill.fills["ds@v1"].reason
        paused[0] = False
        await s.until("done")
        runner.cancel()
        await s.scheduler.close()

    asyncio.run(go())
    assert len(s.hub.fetched) == FILES


def test_fill_stops_when_the_cache_has_no_room_and_never_evicts(tmp_path: Path) -> None:
    # the snapshot fits in the share, but other blocks already fill the cache
    capacity = 2 * FILES * BLOCK
    s = Setup(tmp_path, capacity=capacity)
    s.fill.share = 1.0

    async def go() -> None:
        for i in range(2 * FILES - 4):  # someone else's blocks: nearly full
            await s.cache.admit(f"{i:032x}", b"x" * BLOCK)
        evictions = metrics.EVICTIONS._value.get()
        runner = asyncio.create_task(s.fill.run())
        s.fill.observe([s.refs[0][0]], hit=False)
        await s.until("stopped")
        assert "cache under pressure" in s.fill.fills["ds@v1"].reason
        await s.looked_again()  # it looks again, and stays stopped
        assert s.state() == "stopped"
        assert metrics.EVICTIONS._value.get() == evictions
        runner.cancel()
        await s.scheduler.close()

    asyncio.run(go())
    assert s.hub.fetched == []


def test_a_snapshot_larger_than_the_share_is_not_filled(tmp_path: Path) -> None:
    s = Setup(tmp_path, capacity=FILES * BLOCK)  # the share is half of it

    async def go() -> None:
        runner = asyncio.create_task(s.fill.run())
        s.fill.observe([s.refs[0][0]], hit=False)
        await s.parked()  # a "too large" fill gets no pass: the loop looked, and waits
        runner.cancel()
        await s.scheduler.close()

    asyncio.run(go())
    assert s.state() == "too large"
    assert "more than 50% of the cache" in s.fill.fills["ds@v1"].reason
    assert s.hub.fetched == []


def test_fill_survives_a_link_cut(tmp_path: Path) -> None:
    s = Setup(tmp_path, miss_deadline=0.3)
    s.hub.down = 1_000_000  # cut

    async def go() -> None:
        runner = asyncio.create_task(s.fill.run())
        s.fill.observe([s.refs[0][0]], hit=False)
        await s.until("waiting")
        assert "hub unavailable" in s.fill.fills["ds@v1"].reason
        s.hub.down = 0  # the link is back
        await s.until("done")
        runner.cancel()
        await s.scheduler.close()

    asyncio.run(go())
    assert all(s.cache.contains(d) for d, _ in s.refs)


def test_a_demand_miss_during_a_fill_goes_first(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    s.scheduler.pacer.max_streams = 1
    s.scheduler.batch_blocks = 1

    async def go() -> None:
        s.scheduler.prefetch(s.refs[:-1], Priority.FILL)  # a fill's queue
        await s.scheduler.ensure(s.refs[-1:])
        assert s.hub.fetched.index(s.refs[-1][0]) <= 1  # behind what was on the wire
        await s.scheduler.close()

    asyncio.run(go())


@pytest.mark.parametrize("mode", ["off"])
def test_fill_off_fills_nothing(tmp_path: Path, mode: FillMode) -> None:
    s = Setup(tmp_path, mode=mode)

    async def go() -> None:
        runner = asyncio.create_task(s.fill.run())
        s.fill.observe([s.refs[0][0]], hit=False)
        await s.parked()  # with fill off no Fill exists to count passes: the loop waits
        runner.cancel()
        await s.scheduler.close()

    asyncio.run(go())
    assert s.fill.fills == {} and s.hub.fetched == []


def test_bad_share_and_rate_are_refused(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    with pytest.raises(ValueError, match="share"):
        BackgroundFill(s.fill.index, s.scheduler, s.cache, share=0)
    with pytest.raises(ValueError, match="rate"):
        BackgroundFill(s.fill.index, s.scheduler, s.cache, rate_bps=-1)
