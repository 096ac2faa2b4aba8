"""Prefetch that earns its bytes, over a real cache and scheduler and a fake hub: a source
whose blocks are evicted unread is turned off, only a confirmed read brings it back, and
a block fetched ahead never displaces one the policy ranks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from spoke.cache.blockcache import BlockCache
from spoke.cache.lru import LRUPolicy
from spoke.cache.store import BlockStore, open_index
from spoke.disk.layout import CacheLayout, block_digest
from spoke.fetch.fetcher import Fetcher
from spoke.fetch.ledger import PrefetchLedger
from spoke.fetch.priority import Source
from spoke.fetch.scheduler import FetchScheduler, Priority
from tests.component.block_source import DictSource

BLOCK = 4096


def _setup(
    tmp_path: Path,
    n: int,
    cache_blocks: int,
    window_blocks: int = 16,
    watermarks: tuple[float, float] = (0.5, 0.5),
) -> tuple[DictSource, BlockCache, FetchScheduler, list[tuple[str, int]]]:
    data = [i.to_bytes(4, "big") * (BLOCK // 4) for i in range(n)]
    hub = DictSource({block_digest(b): b for b in data})
    layout = CacheLayout(tmp_path)
    capacity = cache_blocks * BLOCK
    cache = BlockCache(
        BlockStore(layout, open_index(layout)), LRUPolicy(capacity), capacity, *watermarks
    )
    ledger = PrefetchLedger({s: window_blocks * BLOCK for s in Source})
    scheduler = FetchScheduler(Fetcher(hub), cache, ledger=ledger)
    return hub, cache, scheduler, [(block_digest(b), len(b)) for b in data]


async def _settle(scheduler: FetchScheduler) -> None:
    while scheduler.inflight:
        await asyncio.sleep(0.001)


def test_a_source_whose_prefetches_are_all_evicted_unread_issues_no_more(
    tmp_path: Path,
) -> None:
    """Each try: the source prefetches one block into the room above the high watermark
    (half of 8 blocks), then the reader's misses fill the cache and the one that needs
    room takes the unread guess first. The window halves per wasted block, 16 blocks ->
    8, 4, 2, 1, off: after 5 tries the source asks for nothing, however often it is
    called and however much room there is."""
    hub, cache, scheduler, refs = _setup(tmp_path, 164, 8)
    guesses, misses = refs[:32], iter(refs[32:])
    ledger = scheduler.ledger[Source.CROSSFILE]

    async def go() -> list[int]:
        for _ in range(4):  # the reader's blocks, up to the high watermark
            await scheduler.ensure([next(misses)])
        started = []
        for guess in guesses:
            while cache.ranked_bytes > cache.high_bytes:  # the reader's blocks, purged
                cache.drop(cache.resident()[-1])
            started.append(scheduler.prefetch([guess], Priority.READAHEAD, Source.CROSSFILE))
            await _settle(scheduler)
            for _ in range(4):
                await scheduler.ensure([next(misses)])
            assert not cache.contains(guess[0])  # evicted first, unread
        for digest in cache.resident():  # all the room there is: still nothing asked for
            cache.drop(digest)
        started.append(scheduler.prefetch(refs[:3], Priority.READAHEAD, Source.CROSSFILE))
        return started

    started = asyncio.run(go())
    assert started == [1] * 5 + [0] * 28
    assert ledger.window == 0 and ledger.wasted == 5 * BLOCK and ledger.used == 0
    assert [d for d in hub.fetched if d in dict(guesses)] == [d for d, _ in guesses[:5]]
    assert len(ledger.ghosts) == 27 + 3  # asked for while off: remembered, for a reader


def test_an_off_source_comes_back_only_when_a_reader_confirms_it(tmp_path: Path) -> None:
    _, _, scheduler, refs = _setup(tmp_path, 8, 8, window_blocks=1)
    ledger = scheduler.ledger[Source.READAHEAD]
    ledger.shrink(BLOCK)  # off
    assert ledger.window == 0

    async def go() -> tuple[int, int, int]:
        refused = scheduler.prefetch(refs[:2], Priority.READAHEAD)
        scheduler.ledger.note_read([refs[5][0]])  # a read of something it never asked for
        still_off = scheduler.prefetch(refs[2:3], Priority.READAHEAD)
        scheduler.ledger.note_read([refs[0][0]])  # a read of what it would have fetched
        back = scheduler.prefetch(refs[3:5], Priority.READAHEAD)  # room for one block
        await _settle(scheduler)
        return refused, still_off, back

    assert asyncio.run(go()) == (0, 0, 1)
    assert ledger.window == BLOCK and ledger.outstanding == BLOCK
    scheduler.observe([refs[3][0]], hit=True)  # its prefetch was read: used, and it grows
    assert ledger.used == BLOCK and ledger.outstanding == 0 and ledger.window == BLOCK


def test_prefetched_blocks_wait_at_the_cold_end_and_need_room(tmp_path: Path) -> None:
    """A readahead block lands below every block the policy ranks (the next miss that
    needs its room evicts it, not the least recently read block); with no free room
    readahead is not fetched at all."""
    hub, cache, scheduler, refs = _setup(tmp_path, 12, 8)
    read = [d for d, _ in refs[:8]]

    async def go() -> None:
        for ref in refs[:4]:  # up to the high watermark
            await scheduler.ensure([ref])
        assert scheduler.prefetch([refs[8]], Priority.READAHEAD) == 1
        await _settle(scheduler)
        assert cache.resident() == [refs[8][0], *read[:4]]
        for ref in refs[4:8]:  # the cache fills up: the last miss takes the unread guess
            await scheduler.ensure([ref])
        assert cache.resident() == read
        assert scheduler.prefetch([refs[9]], Priority.READAHEAD) == 0  # no room: not asked

    asyncio.run(go())
    assert refs[9][0] not in hub.fetched
    assert scheduler.ledger[Source.READAHEAD].wasted == BLOCK


def test_the_background_evictor_spares_prefetched_blocks_on_their_way_to_a_reader(
    tmp_path: Path,
) -> None:
    """The watermarks count only the blocks the policy ranks: misses pushing those over
    the high watermark make the evictor take ranked blocks, never the unread prefetches
    in the free room, which their reader then reads (used, none wasted)."""
    _, cache, scheduler, refs = _setup(tmp_path, 8, 8, watermarks=(0.5, 0.25))
    ahead, read = refs[5:8], refs[:5]

    async def go() -> None:
        evictor = asyncio.create_task(cache.run_evictor())
        for ref in read[:3]:
            await scheduler.ensure([ref])
        assert scheduler.prefetch(ahead, Priority.READAHEAD) == 3
        await _settle(scheduler)
        for ref in read[3:]:  # ranked blocks: 5 of 8, over the high watermark (4)
            await scheduler.ensure([ref])
        while cache.ranked_bytes > cache.low_bytes:  # the evictor's turn
            await asyncio.sleep(0.001)
        evictor.cancel()

    asyncio.run(go())
    assert cache.resident() == [d for d, _ in (*ahead, *read[3:])]
    scheduler.observe([d for d, _ in ahead], hit=True)
    ledger = scheduler.ledger[Source.READAHEAD]
    assert ledger.used == 3 * BLOCK and ledger.wasted == 0


def test_a_hit_reported_before_its_prefetch_resolved_counts_as_used(tmp_path: Path) -> None:
    """The mount can read a prefetched block file between its landing on disk and the
    flight's resolution (the policy's insert still to run): the read
    still counts the prefetch used in the ledger and read in the policy, so nothing stays
    cached-unread, to be counted wasted when evicted."""
    _, cache, scheduler, refs = _setup(tmp_path, 4, 16)
    ledger = scheduler.ledger[Source.CROSSFILE]
    write = cache.writer.write
    early: list[str] = []

    def report(digests: list[str]) -> None:
        """What the daemon's access log does with a hit: the policy's subscriber, then
        the ledger's."""
        cache.record_access(digests)
        scheduler.observe(digests, hit=True)

    async def write_then_read(digest: str, data: bytes, tick: int, urgent: bool = False) -> None:
        await write(digest, data, tick, urgent)
        if digest in dict(refs[:2]):  # the block file is there: a reader reads it now
            early.append(digest)
            report([digest])

    cache.writer.write = write_then_read  # type: ignore[method-assign]

    async def go() -> None:
        assert scheduler.prefetch(refs, Priority.READAHEAD, Source.CROSSFILE) == 4
        await _settle(scheduler)

    asyncio.run(go())
    assert len(early) == 2
    assert ledger.issued == 4 * BLOCK and ledger.used == 2 * BLOCK
    assert [scheduler.lives.is_unread(d) for d, _ in refs] == [False, False, True, True]
    assert cache.policy.unread_bytes == 2 * BLOCK  # the two read early are read there too
    report([d for d, _ in refs[2:]])  # the usual order: after the flight resolved
    assert ledger.used == ledger.issued and ledger.outstanding == 0 and ledger.wasted == 0
    assert cache.policy.unread_bytes == 0


def test_a_reader_joining_a_block_admitted_ahead_of_it_reads_it_in_the_policy(
    tmp_path: Path,
) -> None:
    """A reader's miss can join a prefetch after the cache placed it ahead of readers
    (its block file being written): the block counts used in the ledger and read in the
    policy, not left at the policy's cold end unread."""
    _, cache, scheduler, refs = _setup(tmp_path, 2, 16)
    ledger = scheduler.ledger[Source.CROSSFILE]
    write = cache.writer.write
    readers: list[asyncio.Task[object]] = []

    async def write_with_a_reader(
        digest: str, data: bytes, tick: int, urgent: bool = False
    ) -> None:
        if digest == refs[0][0]:  # placed ahead: a reader misses it now
            readers.append(asyncio.create_task(scheduler.ensure([refs[0]])))
            await asyncio.sleep(0)
        await write(digest, data, tick, urgent)

    cache.writer.write = write_with_a_reader  # type: ignore[method-assign]

    async def go() -> None:
        assert scheduler.prefetch(refs, Priority.READAHEAD, Source.CROSSFILE) == 2
        await _settle(scheduler)
        assert await readers[0] == ([False], {})

    asyncio.run(go())
    assert ledger.issued == 2 * BLOCK and ledger.used == BLOCK
    assert cache.policy.unread_bytes == BLOCK  # the other one, nobody read
    assert refs[0][0] not in cache.policy.unread()


def test_a_hit_for_a_block_not_arrived_yet_marks_nothing(tmp_path: Path) -> None:
    """A hit reported for a block still on the wire is a stale block file (an earlier
    run's), not a read of this fetch: the block arrives counted unread."""
    hub, cache, scheduler, refs = _setup(tmp_path, 1, 16)
    gate = asyncio.Event()
    serve = hub.read_blocks

    async def gated(
        blocks: Sequence[tuple[str, int]], timeout: float, priority: Priority
    ) -> AsyncIterator[tuple[str, bytes]]:
        await gate.wait()
        async for got in serve(blocks, timeout, priority):
            yield got

    hub.read_blocks = gated  # type: ignore[method-assign]

    async def go() -> None:
        assert scheduler.prefetch(refs, Priority.READAHEAD, Source.CROSSFILE) == 1
        await asyncio.sleep(0.01)  # its batch left: on the wire, not arrived
        cache.record_access([refs[0][0]])
        scheduler.observe([refs[0][0]], hit=True)
        gate.set()
        await _settle(scheduler)

    asyncio.run(go())
    assert scheduler.ledger[Source.CROSSFILE].used == 0
    assert scheduler.lives.is_unread(refs[0][0])
    assert cache.policy.unread_bytes == BLOCK
