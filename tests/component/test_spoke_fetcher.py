"""Fetcher and scheduler against a fake hub: single flight, verification, retries,
deadlines, errors mapped in one place."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc
import grpc.aio
import pytest

from spoke.cache.blockcache import BlockCache
from spoke.cache.lru import LRUPolicy
from spoke.cache.store import BlockStore, open_index
from spoke.disk.layout import CacheLayout, block_digest
from spoke.errors import HubUnavailable, MissDeadline, NotFound
from spoke.fetch.fetcher import Fetcher
from spoke.fetch.scheduler import FetchScheduler
from spoke.hublink.source import HubSource
from tests.support import eventually_async


class FakeHub:
    """Serves blocks from a dict; can fail, corrupt or stall on demand."""

    target = "fake-hub:0"
    refused: str | None = None  # as HubClient: no credentials refused

    def __init__(self, blocks: dict[str, bytes]) -> None:
        self.blocks = blocks
        self.calls: list[list[str]] = []
        self.fail_times = 0
        self.corrupt_times = 0
        self.delay = 0.0

    async def read_blocks(
        self, digests: Sequence[str], timeout: float
    ) -> AsyncIterator[tuple[str, bytes]]:
        self.calls.append(list(digests))
        await asyncio.sleep(self.delay)
        if self.fail_times:
            self.fail_times -= 1
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "down"
            )
        for d in digests:
            if d not in self.blocks:
                raise grpc.aio.AioRpcError(
                    grpc.StatusCode.NOT_FOUND, grpc.aio.Metadata(), grpc.aio.Metadata(), d
                )
            data = self.blocks[d]
            if self.corrupt_times:
                self.corrupt_times -= 1
                data = b"X" + data[1:]
            yield d, data


def _scheduler(
    hub: FakeHub, cache: BlockCache, miss_deadline: float = 60.0, batch_blocks: int = 64
) -> FetchScheduler:
    fetcher = Fetcher(HubSource(hub), miss_deadline=miss_deadline)  # type: ignore[arg-type]
    return FetchScheduler(fetcher, cache, batch_blocks=batch_blocks)


def _setup(tmp_path: Path, n: int = 4) -> tuple[FakeHub, BlockCache, list[tuple[str, int]]]:
    blobs = {}
    for i in range(n):
        data = f"block {i} ".encode() * 1000
        blobs[block_digest(data)] = data
    layout = CacheLayout(tmp_path)
    cache = BlockCache(BlockStore(layout, open_index(layout)), LRUPolicy(1 << 30), 1 << 30)
    return FakeHub(blobs), cache, [(d, len(b)) for d, b in blobs.items()]


def test_sixteen_concurrent_misses_make_one_hub_request(tmp_path: Path) -> None:
    hub, cache, refs = _setup(tmp_path)
    hub.delay = 0.05

    async def go() -> list[tuple[list[bool], dict[str, bytes]]]:
        scheduler = _scheduler(hub, cache)
        return await asyncio.gather(*[scheduler.ensure(refs[:1]) for _ in range(16)])

    results = asyncio.run(go())
    assert hub.calls == [[refs[0][0]]]
    assert all(r == ([False], {}) for r in results)
    assert CacheLayout(tmp_path).block_path(refs[0][0]).read_bytes()[:7] == b"block 0"


def test_batch_and_already_cached(tmp_path: Path) -> None:
    hub, cache, refs = _setup(tmp_path)

    async def go() -> tuple[list[bool], list[bool]]:
        scheduler = _scheduler(hub, cache, batch_blocks=3)
        first, _ = await scheduler.ensure(refs)
        second, _ = await scheduler.ensure(refs)
        return first, second

    first, second = asyncio.run(go())
    assert first == [False] * 4 and second == [True] * 4
    assert [len(c) for c in hub.calls] == [3, 1]


def test_corrupt_block_is_refetched_and_never_cached(tmp_path: Path) -> None:
    hub, cache, refs = _setup(tmp_path)
    hub.corrupt_times = 1

    async def go() -> None:
        await _scheduler(hub, cache).ensure(refs[:1])

    asyncio.run(go())
    assert len(hub.calls) == 2
    path = CacheLayout(tmp_path).block_path(refs[0][0])
    assert block_digest(path.read_bytes()) == refs[0][0]


def test_transient_failures_are_retried(tmp_path: Path) -> None:
    hub, cache, refs = _setup(tmp_path)
    hub.fail_times = 2

    async def go() -> list[bool]:
        scheduler = _scheduler(hub, cache, miss_deadline=10)
        return (await scheduler.ensure(refs[:2]))[0]

    assert asyncio.run(go()) == [False, False]
    assert len(hub.calls) == 3


def test_miss_deadline_then_unavailable(tmp_path: Path) -> None:
    hub, cache, refs = _setup(tmp_path)
    hub.fail_times = 10_000

    async def go() -> None:
        await _scheduler(hub, cache, miss_deadline=0.5).ensure(refs[:1])

    with pytest.raises(HubUnavailable):
        asyncio.run(go())
    assert not cache.contains(refs[0][0])


def test_unknown_block_is_not_found(tmp_path: Path) -> None:
    hub, cache, _ = _setup(tmp_path)

    async def go() -> None:
        await _scheduler(hub, cache).ensure([("0" * 32, 10)])

    with pytest.raises(NotFound):
        asyncio.run(go())


def test_a_failed_disk_write_streams_the_block_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub, cache, refs = _setup(tmp_path)

    def broken(blocks: Sequence[tuple[str, bytes, int]]) -> list[OSError | None]:
        return [OSError(5, "Input/output error") for _ in blocks]  # EIO, not ENOSPC

    monkeypatch.setattr(cache.store, "write_many", broken)

    async def go() -> tuple[list[bool], dict[str, bytes]]:
        scheduler = _scheduler(hub, cache)
        result = await asyncio.wait_for(scheduler.ensure(refs[:2]), 10)  # never hangs
        assert scheduler.on_the_way_bytes == 0 and scheduler.inflight == 0
        return result

    was_cached, uncached = asyncio.run(go())
    assert was_cached == [False, False]
    assert uncached == {d: hub.blocks[d] for d, _ in refs[:2]}  # the bytes, verified
    assert not cache.contains(refs[0][0]) and cache.used_bytes == 0


def test_arrived_blocks_are_written_while_the_stream_goes_on(tmp_path: Path) -> None:
    hub, cache, refs = _setup(tmp_path, n=12)
    calls: list[int] = []
    write_many = cache.store.write_many

    def counting(blocks: Sequence[tuple[str, bytes, int]]) -> list[OSError | None]:
        calls.append(len(blocks))
        return write_many(blocks)

    cache.store.write_many = counting  # type: ignore[method-assign]

    async def go() -> None:
        scheduler = _scheduler(hub, cache, batch_blocks=12)
        await scheduler.ensure(refs)
        assert scheduler.on_the_way_bytes == 0

    asyncio.run(go())
    assert all(cache.contains(d) for d, _ in refs)
    assert sum(calls) == 12 and len(calls) < 12  # batched: fewer writes than blocks


@pytest.mark.timing  # bounds a probe's wall-clock time: run alone (make pytest)
def test_a_miss_that_gave_up_fails_its_retry_at_once(tmp_path: Path) -> None:
    """Issue 17 item 4: the kernel asks again for a page whose read just failed; that miss
    fails at once instead of waiting a second deadline, until the hub delivers again."""
    hub, cache, refs = _setup(tmp_path)
    hub.fail_times = 10_000

    async def go() -> None:
        scheduler = _scheduler(hub, cache, miss_deadline=2.0)
        with pytest.raises(MissDeadline):
            await scheduler.ensure(refs[:2])
        start = time.monotonic()
        for _ in range(3):  # a short probe (its fetch goes on), not another deadline
            with pytest.raises(MissDeadline):
                await scheduler.ensure([refs[1], refs[0]])
        assert time.monotonic() - start < 2.0 * 3  # three probes of 0.2 s, not 6 s
        await eventually_async(lambda: not scheduler._tasks, "the probes' fetch gives up too")
        hub.fail_times = 0  # the hub is back: the next probe's fetch gets the blocks
        assert (await scheduler.ensure(refs[:2]))[0] == [False, False]
        assert (await scheduler.ensure(refs[:3]))[0] == [True, True, False]

    asyncio.run(go())


@pytest.mark.timing  # bounds a batch's wall-clock time: run alone (make pytest)
def test_a_refused_batch_gives_up_at_its_miss_deadline_not_after_a_backoff(
    tmp_path: Path,
) -> None:
    """Issue 25 item 6: a hub refusing every stream at once (stopped, or its link reset):
    the batch's backoff never sleeps past the miss deadline, so its reader fails at the
    deadline (the backoff's doubling sleeps used to carry it to 3-4 s of a 2 s deadline,
    and the kernel's retry, arriving at the deadline, joined it and waited another)."""
    hub, cache, refs = _setup(tmp_path)
    hub.fail_times = 10_000

    async def go() -> None:
        scheduler = _scheduler(hub, cache, miss_deadline=2.0)
        start = time.monotonic()
        with pytest.raises(MissDeadline):
            await scheduler.ensure(refs[:1])
        took = time.monotonic() - start
        await eventually_async(lambda: not scheduler._tasks, "the batch ends", timeout=1.0)
        ended = time.monotonic() - start
        assert 1.8 < took < 2.2, f"the reader failed after {took:.2f} s"
        assert ended < 2.2, f"the batch gave up after {ended:.2f} s"

    asyncio.run(go())


@pytest.mark.timing  # bounds a reader's wall-clock time: run alone (make pytest)
def test_a_reader_gives_up_at_its_own_deadline_and_its_retry_is_a_probe(
    tmp_path: Path,
) -> None:
    """Issue 25 item 6: a reader that joined a fetch started earlier (readahead) follows it
    with a fetch of its own when it runs out, but waits no longer than its own deadline
    (it used to wait for that whole second fetch); and its give-up makes the next miss of
    the block (the kernel's retry) a probe, not another deadline."""
    hub, cache, refs = _setup(tmp_path)
    hub.fail_times = 10_000

    async def go() -> None:
        scheduler = _scheduler(hub, cache, miss_deadline=2.0)
        assert scheduler.prefetch(refs[:1]) == 1  # readahead: its fetch starts now
        # product interval: the readahead's fetch has run 1.2 s of its own 2 s deadline
        # when the reader joins it; the claim is that the reader still waits its own 2 s
        await asyncio.sleep(1.2)
        start = time.monotonic()
        with pytest.raises(MissDeadline):
            await scheduler.ensure(refs[:1])  # joins it, then fetches on its own
        took = time.monotonic() - start
        assert 1.8 < took < 2.2, f"the reader failed after {took:.2f} s, deadline 2 s"
        start = time.monotonic()
        with pytest.raises(MissDeadline):
            await scheduler.ensure(refs[:1])
        took = time.monotonic() - start
        assert took < 0.5, f"the retry after the give-up took {took:.2f} s"
        hub.fail_times = 0  # the hub is back: the fetch going on delivers
        await eventually_async(lambda: cache.contains(refs[0][0]), "the block arrives")
        assert (await scheduler.ensure(refs[:1]))[0] == [True]

    asyncio.run(go())


def test_a_failed_fetch_nobody_waits_for_logs_no_unretrieved_exception(tmp_path: Path) -> None:
    hub, cache, refs = _setup(tmp_path)
    hub.fail_times = 10_000
    problems: list[dict[str, object]] = []

    async def go() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: problems.append(ctx))
        scheduler = _scheduler(hub, cache, miss_deadline=0.3)
        reader = asyncio.create_task(scheduler.ensure(refs[:1]))
        await eventually_async(lambda: scheduler._tasks, "the reader's fetch started")
        reader.cancel()  # the reader gave up (its gRPC call was cancelled)
        with pytest.raises(asyncio.CancelledError):
            await reader
        await eventually_async(lambda: not scheduler._tasks, "the failed fetch ended")
        del reader
        gc.collect()
        await asyncio.sleep(0)

    gc.collect()  # an earlier test's garbage (s3fs sessions) is not this test's to judge
    asyncio.run(go())
    ours = [p for p in problems if "never retrieved" in str(p.get("message")) and _is_ours(p)]
    assert not ours, ours


def _is_ours(problem: dict[str, object]) -> bool:
    """True when the loop problem concerns a task running Strata's code (not a library's)."""
    task = problem.get("future")
    coro = task.get_coro() if isinstance(task, asyncio.Task) else None
    filename = getattr(getattr(coro, "cr_code", None), "co_filename", "")
    return task is None or "site-packages" not in filename
