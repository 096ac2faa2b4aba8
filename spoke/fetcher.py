"""The fetcher: makes blocks resident, merging concurrent misses of the same block.

Single-flight: the first miss of a digest starts one fetch; every later miss of that digest
waits on the same future, so N concurrent readers of one uncached block cost one hub
request. Fetches run with bounded concurrency, batch up to ``batch_blocks`` blocks into one
ReadBlocks stream, carry a per-stream deadline, and retry with exponential backoff and
jitter (tenacity) until the miss deadline. Every block is verified against its digest
before it is admitted; a mismatch is counted and refetched. A block the cache cannot hold
(disk full, everything pinned) is handed to its waiters in memory instead (stream-through).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Sequence

import grpc
import grpc.aio
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential_jitter,
)

from spoke import metrics
from spoke.cache import BlockCache, CacheFull
from spoke.errors import CorruptBlock, HubUnavailable, MissDeadline, NotFound
from spoke.hubclient import HubClient
from spoke.layout import block_digest

log = logging.getLogger(__name__)

ADMIT_AHEAD_BYTES = 16 << 20
"""Most bytes of one stream's arrived blocks waiting for their disk writes at once."""

GAVE_UP_MEMORY_S = 5.0
"""How long a miss that gave up at its deadline shortens new misses of that block to a
probe, while nothing has arrived from the hub since (the kernel asks again at once for a
failed readahead page: without this every failed read took two miss deadlines)."""

PROBE_S = 1.0
"""Longest wait of such a probe (at most a quarter of the miss deadline): its fetch goes on
with the full deadline for later readers, and a hub that came back answers it in time."""


class _Retryable(Exception):
    """A fetch attempt failed in a way another attempt may fix."""


class Fetcher:
    """Fetch missing blocks from the hub into the cache.

    Args:
        hub: where blocks come from.
        cache: where they go.
        miss_deadline: how long a miss may wait for the hub before failing, seconds.
        max_streams: ReadBlocks streams open at once.
        batch_blocks: most blocks asked for in one stream.
        stream_timeout: deadline of one stream, seconds.
        prefetch_budget: most bytes of prefetches in flight at once; requests beyond it are
            dropped, so readahead never crowds out what readers are waiting for.
    """

    def __init__(
        self,
        hub: HubClient,
        cache: BlockCache,
        miss_deadline: float = 60.0,
        max_streams: int = 8,
        batch_blocks: int = 16,
        stream_timeout: float = 60.0,
        prefetch_budget: int = 256 << 20,
    ) -> None:
        self.hub = hub
        self.cache = cache
        self.miss_deadline = miss_deadline
        self.batch_blocks = batch_blocks
        self.stream_timeout = stream_timeout
        self._streams = asyncio.Semaphore(max_streams)
        self._inflight: dict[str, asyncio.Future[bytes | None]] = {}
        self.prefetch_budget = prefetch_budget
        self._prefetch_inflight = 0  # bytes of prefetches not yet admitted
        self._on_the_way: dict[str, int] = {}  # digest -> size, asked for and not arrived
        self._on_the_way_bytes = 0
        self._prefetched: dict[str, int] = {}  # prefetched, not yet read: digest -> size
        cache.on_evict.append(self._evicted)
        self._tasks: set[asyncio.Task[None]] = set()
        self._gave_up: dict[str, tuple[float, MissDeadline]] = {}  # digest -> when, why
        self._last_arrival = float("-inf")  # monotonic time a block last came from the hub

    async def ensure(
        self, blocks: Sequence[tuple[str, int]]
    ) -> tuple[list[bool], dict[str, bytes]]:
        """Make every ``(digest, size)`` resident.

        Returns:
            Per block, whether it was already cached; and the bytes of blocks that could not
            be cached (streamed through), by digest.

        Raises:
            MissDeadline: the hub could not deliver before the miss deadline (or, when a
                miss of one of these blocks just gave up and nothing arrived from the hub
                since, within a short probe: :data:`PROBE_S`).
            NotFound: the hub does not have a block.
        """
        was_cached: list[bool] = []
        waits: list[tuple[str, asyncio.Future[bytes | None]]] = []
        to_fetch: list[str] = []
        loop = asyncio.get_running_loop()
        gave_up = next(
            (
                error
                for digest, _ in blocks
                if not self.cache.contains(digest) and (error := self._gave_up_on(digest))
            ),
            None,
        )
        for digest, size in blocks:
            if self.cache.contains(digest):
                was_cached.append(True)
                continue
            was_cached.append(False)
            metrics.CACHE_MISSES.inc()
            future = self._inflight.get(digest)
            if future is None:
                future = loop.create_future()
                future.add_done_callback(_retrieve)  # its waiters may all have given up
                self._inflight[digest] = future
                self._expect(digest, size)
                to_fetch.append(digest)
            waits.append((digest, future))
        for start in range(0, len(to_fetch), self.batch_blocks):
            batch = to_fetch[start : start + self.batch_blocks]
            task = asyncio.create_task(self._fetch(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        uncached: dict[str, bytes] = {}
        probe_end = loop.time() + min(PROBE_S, self.miss_deadline / 4)
        for digest, future in waits:
            # shield: a caller giving up must not cancel a fetch others wait on
            if gave_up is None:
                data = await asyncio.shield(future)
            else:
                try:
                    data = await asyncio.wait_for(
                        asyncio.shield(future), max(probe_end - loop.time(), 0)
                    )
                except TimeoutError:
                    raise gave_up from None
            if data is not None:
                uncached[digest] = data
        return was_cached, uncached

    def _gave_up_on(self, digest: str) -> MissDeadline | None:
        """The error of a recent miss of ``digest`` that gave up at its deadline, if the
        hub has delivered nothing since; else None."""
        gave_up = self._gave_up.get(digest)
        if gave_up is None:
            return None
        when, error = gave_up
        now = time.monotonic()
        if now - when < min(GAVE_UP_MEMORY_S, self.miss_deadline) and when > self._last_arrival:
            return error
        del self._gave_up[digest]
        return None

    def prefetch(self, blocks: Sequence[tuple[str, int]]) -> int:
        """Start fetching blocks nobody waits for yet (readahead, prewarm); returns at once.

        Blocks already cached or being fetched are skipped, and so is everything past the
        prefetch byte budget.

        Returns:
            How many fetches were started.
        """
        loop = asyncio.get_running_loop()
        started: list[str] = []
        for digest, size in blocks:
            if self.cache.contains(digest) or digest in self._inflight:
                continue
            if self._prefetch_inflight + size > self.prefetch_budget:
                break
            self._prefetch_inflight += size
            future: asyncio.Future[bytes | None] = loop.create_future()
            future.add_done_callback(functools.partial(self._prefetch_done, digest, size))
            self._inflight[digest] = future
            self._expect(digest, size)
            started.append(digest)
        for start in range(0, len(started), self.batch_blocks):
            task = asyncio.create_task(self._fetch(started[start : start + self.batch_blocks]))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return len(started)

    def note_read(self, digests: Sequence[str]) -> None:
        """Readers read these blocks: prefetches among them were used."""
        for digest in digests:
            size = self._prefetched.pop(digest, None)
            if size is not None:
                metrics.PREFETCH_USED_BYTES.inc(size)

    def _prefetch_done(self, digest: str, size: int, future: asyncio.Future[bytes | None]) -> None:
        self._prefetch_inflight -= size
        if not future.cancelled() and future.exception() is None and future.result() is None:
            metrics.PREFETCH_BYTES.inc(size)
            self._prefetched[digest] = size

    def _evicted(self, digest: str, size: int) -> None:
        if self._prefetched.pop(digest, None) is not None:
            metrics.PREFETCH_WASTED_BYTES.inc(size)

    def is_fetching(self, digest: str) -> bool:
        """True while a fetch of ``digest`` is in flight."""
        return digest in self._inflight

    @property
    def on_the_way_bytes(self) -> int:
        """Bytes of blocks asked of the hub that have not arrived yet (demand misses and
        prefetches; once a block arrives, the cache counts it as being admitted)."""
        return self._on_the_way_bytes

    def _expect(self, digest: str, size: int) -> None:
        self._on_the_way[digest] = size
        self._on_the_way_bytes += size

    def _arrived(self, digest: str) -> None:
        self._on_the_way_bytes -= self._on_the_way.pop(digest, 0)

    @property
    def inflight(self) -> int:
        """Blocks being fetched now."""
        return len(self._inflight)

    async def close(self) -> None:
        """Cancel fetches in flight."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _fetch(self, digests: list[str]) -> None:
        pending = list(digests)
        deadline = time.monotonic() + self.miss_deadline
        metrics.INFLIGHT_FETCHES.set(len(self._inflight))
        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_delay(self.miss_deadline),
                wait=wait_exponential_jitter(initial=0.1, max=5.0, jitter=0.5),
                retry=retry_if_exception_type(_Retryable),
                reraise=True,
            ):
                with attempt:  # no attempt outlives the miss deadline (a silent link)
                    left = deadline - time.monotonic()
                    await self._attempt(pending, max(min(self.stream_timeout, left), 0.05))
        except _Retryable as err:
            error = MissDeadline(
                f"hub {self.hub.target} did not deliver within {self.miss_deadline:g} s: {err}"
            )
            now = time.monotonic()
            for digest in pending:
                self._gave_up[digest] = (now, error)
            while len(self._gave_up) > 4096:  # oldest first
                del self._gave_up[next(iter(self._gave_up))]
            self._fail(pending, error)
        except NotFound as err:
            self._fail(pending, err)
        except Exception as err:  # never leave a waiter hanging
            log.exception("fetch of %d blocks failed", len(pending))
            self._fail(pending, HubUnavailable(f"fetch failed: {err}"))
        finally:
            metrics.INFLIGHT_FETCHES.set(len(self._inflight))

    async def _attempt(self, pending: list[str], timeout: float) -> None:
        """One ReadBlocks stream for ``pending`` (deadline ``timeout`` seconds); removes each
        digest once it has arrived.

        Arrived blocks are admitted by tasks of their own while the stream goes on (each
        admission is a disk write in a worker thread; awaiting them one by one held every
        stream to one block per thread hand-off), at most :data:`ADMIT_AHEAD_BYTES` of
        them at once; the attempt returns when all of them are done.
        """
        started = time.monotonic()
        admitting: dict[asyncio.Task[None], int] = {}
        async with self._streams:
            try:
                async for digest, data in self.hub.read_blocks(list(pending), timeout):
                    if block_digest(data) != digest:
                        metrics.CORRUPT_BLOCKS.inc()
                        raise _Retryable(str(CorruptBlock(f"block {digest} failed verification")))
                    metrics.HUB_FETCH_BYTES.inc(len(data))
                    metrics.HUB_FETCH_BLOCKS.inc()
                    self._last_arrival = time.monotonic()
                    pending.remove(digest)
                    self._arrived(digest)
                    while admitting and sum(admitting.values()) + len(data) > ADMIT_AHEAD_BYTES:
                        await asyncio.wait(admitting, return_when=asyncio.FIRST_COMPLETED)
                    task = asyncio.create_task(self._admit(digest, data))
                    admitting[task] = len(data)
                    task.add_done_callback(admitting.pop)
                metrics.HUB_UP.set(1)
            except grpc.aio.AioRpcError as err:
                code = err.code()
                metrics.HUB_FETCH_ERRORS.labels(code.name).inc()
                if code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
                    metrics.HUB_UP.set(1)
                    raise NotFound(f"hub: {err.details()}") from err
                metrics.HUB_UP.set(0)
                log.warning("hub fetch failed (%s: %s); retrying", code.name, err.details())
                raise _Retryable(f"{code.name}: {err.details()}") from err
            except ValueError as err:
                raise _Retryable(str(err)) from err
            finally:
                if admitting:
                    await asyncio.wait(list(admitting))
                metrics.HUB_FETCH_SECONDS.observe(time.monotonic() - started)
        if pending:
            raise _Retryable(f"stream ended with {len(pending)} blocks missing")

    async def _admit(self, digest: str, data: bytes) -> None:
        """Cache a verified block and hand it to its waiters; never raises.

        A block the cache cannot take (disk full with nothing evictable, or a failed
        write) is handed to its waiters in memory instead, so their reads still succeed.
        """
        try:
            await self.cache.admit(digest, data)
        except CacheFull as err:
            log.warning("%s; streaming the block through uncached", err)
            metrics.STREAMED_THROUGH.inc()
            self._resolve(digest, None, data)
            return
        except Exception:
            log.exception("could not cache block %s; streaming it through uncached", digest)
            metrics.STREAMED_THROUGH.inc()
            self._resolve(digest, None, data)
            return
        self._resolve(digest, None)

    def _resolve(self, digest: str, error: BaseException | None, data: bytes | None = None) -> None:
        self._arrived(digest)  # (a failed fetch never arrives)
        future = self._inflight.pop(digest, None)
        if future is None or future.done():
            return
        if error is None:
            future.set_result(data)
        else:
            future.set_exception(error)

    def _fail(self, digests: list[str], error: BaseException) -> None:
        for digest in digests:
            self._resolve(digest, error)


def _retrieve(future: asyncio.Future[bytes | None]) -> None:
    """Mark a fetch's outcome as seen, so a failure nobody waits for any more (every
    reader gave up) is not logged as "Future exception was never retrieved"."""
    if not future.cancelled():
        future.exception()
