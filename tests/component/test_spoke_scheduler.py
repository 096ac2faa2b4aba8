"""The fetch scheduler over a real cache and a fake hub: class order, the window, the
prefetch ledger, and demand misses overtaking queued prefetches."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from spoke import metrics
from spoke.cache.admission import Placement
from spoke.cache.blockcache import BlockCache
from spoke.cache.lru import LRUPolicy
from spoke.cache.store import BlockStore, open_index
from spoke.disk.layout import CacheLayout, block_digest
from spoke.fetch.fetcher import Fetcher
from spoke.fetch.gather import DEMAND_GATHER_S
from spoke.fetch.scheduler import FetchScheduler, Priority
from spoke.fetch.window import LinkWindow
from tests.support import eventually_async

BLOCK = 4096


class SlowHub:
    """Serves blocks from a dict, ``delay`` seconds per stream; records each stream and the
    scheduler's bytes on the wire when it opened."""

    name = "slow-hub:0"

    def __init__(self, blocks: dict[str, bytes], delay: float = 0.02) -> None:
        self.blocks = blocks
        self.delay = delay
        self.calls: list[list[str]] = []
        self.wire_at_open: list[int] = []
        self.scheduler: FetchScheduler | None = None

    async def read_blocks(
        self, blocks: Sequence[tuple[str, int]], timeout: float, priority: Priority
    ) -> AsyncIterator[tuple[str, bytes]]:
        digests = [d for d, _ in blocks]
        self.calls.append(list(digests))
        if self.scheduler is not None:
            self.wire_at_open.append(self.scheduler.wire_bytes)
        await asyncio.sleep(self.delay)
        for d in digests:
            yield d, self.blocks[d]


def _setup(
    tmp_path: Path, n: int, demand_gather_s: float = DEMAND_GATHER_S, **kwargs: int
) -> tuple[SlowHub, BlockCache, FetchScheduler, list[tuple[str, int]]]:
    blobs = {}
    for i in range(n):
        data = i.to_bytes(4, "big") * (BLOCK // 4)
        blobs[block_digest(data)] = data
    layout = CacheLayout(tmp_path)
    cache = BlockCache(BlockStore(layout, open_index(layout)), LRUPolicy(1 << 30), 1 << 30)
    hub = SlowHub(blobs)
    window = LinkWindow(floor=kwargs.pop("window", 1 << 20), ceiling=1 << 30)
    scheduler = FetchScheduler(
        Fetcher(hub), cache, window=window, demand_gather_s=demand_gather_s, **kwargs
    )
    hub.scheduler = scheduler
    return hub, cache, scheduler, [(d, len(b)) for d, b in blobs.items()]


def test_a_demand_miss_is_written_in_the_urgent_lane_and_a_prewarm_is_not(
    tmp_path: Path,
) -> None:
    """A reader waits for a demand miss: its block skips the other writes' queue
    (spoke.cache.writer's urgent lane); a prewarm's and a readahead's do not."""
    _, cache, scheduler, refs = _setup(tmp_path, 3)
    lanes: dict[str, bool] = {}
    admit = cache.admit

    async def recording_admit(
        digest: str, data: bytes, placement: Placement, urgent: bool = False
    ) -> None:
        lanes[digest] = urgent
        await admit(digest, data, placement, urgent)

    cache.admit = recording_admit  # type: ignore[method-assign]

    async def go() -> None:
        await scheduler.ensure([refs[0]])
        await scheduler.ensure([refs[1]], Priority.PREWARM)
        scheduler.prefetch([refs[2]], Priority.READAHEAD)
        while scheduler.inflight:
            await asyncio.sleep(0.01)

    asyncio.run(go())
    assert lanes == {refs[0][0]: True, refs[1][0]: False, refs[2][0]: False}


def test_a_demand_miss_overtakes_queued_prefetches(tmp_path: Path) -> None:
    hub, cache, scheduler, refs = _setup(tmp_path, 21, max_streams=1, batch_blocks=1)
    *ahead, wanted = refs

    async def go() -> None:
        assert scheduler.prefetch(ahead, Priority.READAHEAD) == 20
        assert scheduler.queued(Priority.READAHEAD)[0] == 19  # one is on the wire
        await scheduler.ensure([wanted])
        assert cache.contains(wanted[0])
        # the demand miss went out next to the one prefetch already on the wire
        assert hub.calls[:2] == [[ahead[0][0]], [wanted[0]]]
        assert scheduler.queued(Priority.READAHEAD)[0] >= 18
        while scheduler.inflight:
            await asyncio.sleep(0.01)

    asyncio.run(go())
    assert all(cache.contains(d) for d, _ in refs)
    assert sorted(len(c) for c in hub.calls) == [1] * 21  # each block fetched once


def test_a_demand_miss_on_a_queued_prefetch_moves_it_ahead(tmp_path: Path) -> None:
    hub, _, scheduler, refs = _setup(tmp_path, 12, max_streams=1, batch_blocks=1)

    async def go() -> None:
        scheduler.prefetch(refs[:10], Priority.FILL)
        scheduler.prefetch(refs[10:], Priority.HINT)
        await scheduler.ensure([refs[9]])  # queued last, for fill
        while scheduler.inflight:
            await asyncio.sleep(0.01)

    asyncio.run(go())
    order = [c[0] for c in hub.calls]
    assert order[0] == refs[0][0]  # already on the wire
    assert order[1] == refs[9][0]  # the demand miss, on a stream of its own
    assert order[2:4] == [refs[10][0], refs[11][0]]  # hinted before fill
    assert len(order) == 12  # single flight: refs[9] fetched once


def test_classes_leave_most_urgent_first(tmp_path: Path) -> None:
    hub, _, scheduler, refs = _setup(tmp_path, 9, max_streams=1, batch_blocks=1)

    async def go() -> None:
        scheduler.prefetch(refs[0:1], Priority.FILL)  # goes at once: the link is idle
        scheduler.prefetch(refs[1:3], Priority.FILL)
        scheduler.prefetch(refs[3:5], Priority.PREWARM)
        scheduler.prefetch(refs[5:7], Priority.READAHEAD)
        scheduler.prefetch(refs[7:9], Priority.HINT)
        while scheduler.inflight:
            await asyncio.sleep(0.01)

    asyncio.run(go())
    expected = [0, 7, 8, 5, 6, 3, 4, 1, 2]
    assert [c[0] for c in hub.calls] == [refs[i][0] for i in expected]


def test_a_peers_request_waits_behind_local_demand_and_goes_before_prefetch(
    tmp_path: Path,
) -> None:
    hub, _, scheduler, refs = _setup(tmp_path, 4, max_streams=1, batch_blocks=1)

    async def go() -> None:
        scheduler.prefetch(refs[0:1], Priority.FILL)  # takes the one shared stream
        scheduler.prefetch(refs[1:2], Priority.HINT)
        scheduler.prefetch(refs[2:3], Priority.PEER)
        # a peer's request never opens one of demand's own streams: it waits its turn
        assert scheduler.queued(Priority.PEER) == (1, BLOCK)
        await scheduler.ensure(refs[3:4], Priority.DEMAND)  # leaves at once
        while scheduler.inflight:
            await asyncio.sleep(0.01)

    asyncio.run(go())
    assert [c[0] for c in hub.calls] == [refs[i][0] for i in (0, 3, 2, 1)]


def test_sixteen_waiters_of_a_queued_block_make_one_fetch(tmp_path: Path) -> None:
    hub, _, scheduler, refs = _setup(tmp_path, 2, max_streams=1, batch_blocks=1)

    async def go() -> None:
        scheduler.prefetch(refs[:2], Priority.READAHEAD)
        await asyncio.gather(*[scheduler.ensure(refs[1:2]) for _ in range(16)])

    asyncio.run(go())
    assert [c[0] for c in hub.calls].count(refs[1][0]) == 1


def test_every_count_returns_to_zero_when_a_queued_fill_is_asked_for_as_hinted(
    tmp_path: Path,
) -> None:
    # a peer may ask in the hint class for a block this spoke has queued for fill: the
    # flight joins a speculative class, and leaves it again when it is done
    _, _, scheduler, refs = _setup(tmp_path, 6, max_streams=1, batch_blocks=1)

    async def go() -> None:
        assert scheduler.prefetch(refs, Priority.FILL) == 6
        await scheduler.ensure(refs[-2:], Priority.HINT)
        assert scheduler.prefetch_room == scheduler.prefetch_budget
        await scheduler.ensure(refs)  # every fetch done
        assert scheduler.prefetch_room == scheduler.prefetch_budget
        assert scheduler.on_the_way_bytes == scheduler.wire_bytes == 0
        assert scheduler.admitting_bytes == 0 and scheduler.inflight == 0
        assert all(scheduler.queued(p) == (0, 0) for p in Priority)
        await scheduler.close()

    asyncio.run(go())


def test_the_window_bounds_bytes_on_the_wire(tmp_path: Path) -> None:
    hub, cache, scheduler, refs = _setup(
        tmp_path, 40, window=3 * BLOCK, max_streams=8, batch_blocks=1
    )
    scheduler.window.ceiling = 3 * BLOCK

    async def go() -> None:
        scheduler.prefetch(refs, Priority.PREWARM)
        assert scheduler.wire_bytes == 3 * BLOCK  # three streams of one block
        while scheduler.inflight:
            assert scheduler.wire_bytes <= 3 * BLOCK
            await asyncio.sleep(0.005)

    asyncio.run(go())
    assert all(cache.contains(d) for d, _ in refs)
    assert max(hub.wire_at_open) <= 3 * BLOCK


def test_ledger_counts_issued_used_and_prewarm_is_not_a_miss(tmp_path: Path) -> None:
    _, _, scheduler, refs = _setup(tmp_path, 6)
    issued0 = metrics.PREFETCH_BYTES._value.get()
    used0 = metrics.PREFETCH_USED_BYTES._value.get()
    misses0 = metrics.CACHE_MISSES._value.get()

    async def go() -> None:
        scheduler.prefetch(refs[:3], Priority.READAHEAD)
        await scheduler.ensure(refs[3:], Priority.PREWARM)
        while scheduler.inflight:
            await asyncio.sleep(0.01)
        scheduler.observe([refs[0][0], refs[3][0]], hit=True)  # one prefetched, one prewarmed

    asyncio.run(go())
    assert metrics.PREFETCH_BYTES._value.get() - issued0 == 3 * BLOCK
    assert metrics.PREFETCH_USED_BYTES._value.get() - used0 == BLOCK
    assert metrics.CACHE_MISSES._value.get() == misses0  # the scheduler counts no reads


@pytest.mark.parametrize(
    ("rate", "rtt", "low", "high"),
    [
        (125e6, 0.050, 10e6, 15e6),  # 1 Gbit/s at 50 ms: 2 × BDP = 12.5 MB
        (1e6, 0.050, 8 << 20, 8 << 20),  # a slow link: the floor
        (10e9, 0.2, 256 << 20, 256 << 20),  # fast and far: the ceiling
    ],
)
def test_window_is_gain_times_rate_times_rtt(
    rate: float, rtt: float, low: float, high: float
) -> None:
    now = [0.0]
    window = LinkWindow(clock=lambda: now[0])
    assert window.bytes == window.floor  # no samples yet
    window.on_rtt(rtt * 3)
    window.on_rtt(rtt)  # the minimum counts
    window.on_rtt(rtt * 2)
    block = int(rate * 0.005)  # a block every 5 ms, for 1 s
    for _ in range(200):
        now[0] += 0.005
        window.on_delivered(block)
    assert window.rtt_s == rtt
    assert window.rate_bps is not None and 0.9 * rate <= window.rate_bps <= 1.1 * rate
    assert low <= window.bytes <= high


def test_bursty_arrivals_do_not_inflate_the_rate() -> None:
    """A loop that was off the CPU gets a burst of queued blocks at once: the rate stays
    the link's (125 MB/s here, 12.5 MB every 100 ms, each burst within 1 ms)."""
    now = [0.0]
    window = LinkWindow(clock=lambda: now[0])
    window.on_rtt(0.05)
    for _ in range(30):
        now[0] += 0.099
        for _ in range(10):
            now[0] += 0.0001
            window.on_delivered(1_250_000)
    assert window.rate_bps is not None and window.rate_bps <= 1.3 * 125e6


def test_window_forgets_old_samples() -> None:
    now = [0.0]
    window = LinkWindow(clock=lambda: now[0], rate_span_s=3.0, rtt_span_s=10.0)
    window.on_rtt(0.05)
    for _ in range(100):
        now[0] += 0.008
        window.on_delivered(1 << 20)
    assert window.bytes > window.floor
    now[0] += 11.0
    assert window.rtt_s is None and window.rate_bps is None
    assert window.bytes == window.floor


def test_window_rejects_a_floor_above_its_ceiling() -> None:
    with pytest.raises(ValueError, match="floor"):
        LinkWindow(floor=2 << 20, ceiling=1 << 20)


def test_a_stream_frees_its_slot_when_its_blocks_arrive_and_disk_writes_are_bounded(
    tmp_path: Path,
) -> None:
    """A stream whose blocks have all arrived no longer counts against the stream cap (its
    disk writes may still run), but arrived blocks waiting for the disk count against
    twice the window, so a slow disk holds prefetch back instead of filling memory."""
    hub, cache, scheduler, refs = _setup(
        tmp_path, 10, window=2 * BLOCK, max_streams=2, batch_blocks=1
    )
    scheduler.window.ceiling = 2 * BLOCK
    disk = asyncio.Event()
    admit = cache.admit

    async def slow_admit(
        digest: str, data: bytes, placement: Placement, urgent: bool = False
    ) -> None:
        await disk.wait()
        await admit(digest, data, placement, urgent)

    cache.admit = slow_admit  # type: ignore[method-assign]

    async def go() -> None:
        scheduler.prefetch(refs, Priority.PREWARM)
        await eventually_async(
            lambda: scheduler.admitting_bytes >= 4 * BLOCK, "four blocks waiting for the disk"
        )
        # A fifth stream would open when a slot frees (a stream's blocks arriving), and the
        # fake hub records a call as it opens: once every stream that went out has had its
        # block arrive (no slot held) and the other six blocks still wait to leave, nothing
        # is left that could open one until the disk takes a block.
        await eventually_async(
            lambda: scheduler.pacer.busy == 0 and scheduler.queued(Priority.PREWARM)[0] == 6,
            "every stream's block arrived, the rest queued",
        )
        # two slots, yet four streams went out: each freed its slot on arrival; the
        # fifth waits, as four blocks wait for the disk (2 × a 2-block window)
        assert len(hub.calls) == 4
        assert scheduler.admitting_bytes == 4 * BLOCK
        assert not any(cache.contains(d) for d, _ in refs)
        disk.set()
        while scheduler.inflight:
            await asyncio.sleep(0.01)
        assert scheduler.admitting_bytes == 0

    asyncio.run(go())
    assert all(cache.contains(d) for d, _ in refs)
    assert sorted(c[0] for c in hub.calls) == sorted(d for d, _ in refs)  # each once


def test_concurrent_demand_misses_share_a_stream_and_a_lone_one_leaves_at_once(
    tmp_path: Path,
) -> None:
    # a gather time far longer than the test: what releases the gathered misses is the
    # first block of the stream out, not the timer
    hub, cache, scheduler, refs = _setup(tmp_path, 9, demand_gather_s=30)

    async def go() -> None:
        first = asyncio.create_task(scheduler.ensure(refs[:1]))
        await asyncio.sleep(0)
        # alone: it left at once, on a stream that waits for its first block
        assert scheduler.queued(Priority.DEMAND) == (0, 0)
        assert scheduler.pacer.unanswered_demand == 1
        rest = [asyncio.create_task(scheduler.ensure([r])) for r in refs[1:]]
        await asyncio.sleep(0)
        assert scheduler.queued(Priority.DEMAND) == (8, 8 * BLOCK)  # gathering meanwhile
        await asyncio.wait_for(asyncio.gather(first, *rest), 10)

    asyncio.run(go())
    assert hub.calls == [[refs[0][0]], [d for d, _ in refs[1:]]]
    assert all(cache.contains(d) for d, _ in refs)
    assert scheduler.pacer.unanswered_demand == 0


def test_gathered_demand_leaves_when_the_gather_time_runs_out(tmp_path: Path) -> None:
    hub, _, scheduler, refs = _setup(tmp_path, 3, demand_gather_s=0.01)
    hub.delay = 5.0  # the first stream's block is far off: the timer releases the rest

    async def go() -> None:
        first = asyncio.create_task(scheduler.ensure(refs[:1]))
        await asyncio.sleep(0)
        rest = [asyncio.create_task(scheduler.ensure([r])) for r in refs[1:]]
        while len(hub.calls) < 2:
            await asyncio.sleep(0.005)
        assert hub.calls[1] == [d for d, _ in refs[1:]]  # together, before the first arrived
        for task in (first, *rest):
            task.cancel()
        await asyncio.gather(first, *rest, return_exceptions=True)
        await scheduler.close()

    asyncio.run(go())


def test_demand_never_gathers_when_gathering_is_off(tmp_path: Path) -> None:
    hub, _, scheduler, refs = _setup(tmp_path, 4, demand_gather_s=0)

    async def go() -> None:
        await asyncio.gather(*[scheduler.ensure([r]) for r in refs])

    asyncio.run(go())
    assert sorted(hub.calls) == sorted([d] for d, _ in refs)
