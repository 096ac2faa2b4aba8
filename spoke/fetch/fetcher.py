"""The fetcher: runs one batch of block fetches against a :class:`~spoke.fetch.source.BlockSource`.

A batch is one stream from the source, carrying a per-stream deadline and retried with
exponential backoff and jitter (tenacity) until the miss deadline; each retry asks only for
what has not arrived. Every block is verified against its digest before it goes on; a
mismatch is counted and refetched. What to fetch, when, and who waits for it is the
scheduler's business (:mod:`spoke.fetch.scheduler`); the fetcher writes each verified
block, and each failure, through a :class:`BlockSink` (:class:`~spoke.fetch.sink.CacheSink`:
into the cache, moving the block's life). It owns every deadline
(:mod:`spoke.fetch.deadlines`): its batches', and a reader's wait (:meth:`Fetcher.wait`),
which the scheduler asks for instead of reading the fetcher's state.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Iterable, Sequence
from typing import Protocol

from spoke import metrics
from spoke.cache.staging import Staged
from spoke.cache.store import Received
from spoke.disk.layout import block_digest
from spoke.errors import CorruptBlock, HubUnavailable, MissDeadline, SpokeError
from spoke.fetch.deadlines import RETRIED, Deadlines, ReaderWait
from spoke.fetch.priority import Priority
from spoke.fetch.source import BlockSource

log = logging.getLogger(__name__)

ADMIT_AHEAD_BYTES = 16 << 20
"""A stream reads its next block only while at most this many bytes of its arrived blocks
wait for their disk writes."""


class BlockSink(Protocol):
    """Where a batch's blocks go, as they arrive."""

    def first_bytes(self, seconds: float, nbytes: int) -> None:
        """A stream's first block (``nbytes``) arrived ``seconds`` after it was opened."""

    def put(self, digest: str, data: Received) -> Coroutine[None, None, None]:
        """A verified block arrived; the coroutine returned settles it (never raises)."""

    def fail(self, digests: Iterable[str], error: BaseException) -> None:
        """The fetch of ``digests`` gave up with ``error``."""


class Fetcher:
    """Fetch batches of blocks from a source into a sink.

    Args:
        source: where blocks come from.
        miss_deadline: how long a batch may keep retrying before it fails, and a reader
            may wait, seconds.
        stream_timeout: deadline of one stream, seconds.
    """

    def __init__(
        self,
        source: BlockSource,
        miss_deadline: float = 60.0,
        stream_timeout: float = 60.0,
    ) -> None:
        self.source = source
        self.deadlines = Deadlines(miss_deadline, stream_timeout)
        # a source that hashes what it yields (the bulk channel's receive threads,
        # spoke/hublink/bulk.py) is not hashed twice, on the loop
        self._verified = bool(getattr(source, "verifies", False))

    @property
    def name(self) -> str:
        """Where blocks come from (the source's name: the hub's ``HOST:PORT``)."""
        return self.source.name

    def wait(self, misses: Sequence[str]) -> ReaderWait:
        """The wait of a reader that misses ``misses``, starting now: its own miss
        deadline, or only a probe if a fetch of one of them just gave up
        (:meth:`spoke.fetch.deadlines.Deadlines.reader`)."""
        return self.deadlines.reader(misses)

    async def fetch(
        self, blocks: Sequence[tuple[str, int]], priority: Priority, sink: BlockSink
    ) -> None:
        """Fetch ``(digest, size)`` of class ``priority`` into ``sink`` until each is put
        or failed (never raises, except on cancellation: then the blocks not yet settled
        are left to the caller)."""
        pending = dict(blocks)
        retrying, stream_timeout = self.deadlines.attempts()
        try:
            async for attempt in retrying:
                with attempt:
                    await self._attempt(pending, priority, sink, stream_timeout())
        except RETRIED as err:
            miss_deadline = self.deadlines.miss_deadline
            error = MissDeadline(
                f"{self.source.name} did not deliver within {miss_deadline:g} s: {err}"
            )
            self.deadlines.gave_up(pending, error)
            sink.fail(pending, error)
        except SpokeError as err:  # NotFound, InvalidRequest: another attempt cannot help
            sink.fail(pending, err)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # never leave a waiter hanging
            log.exception("fetch of %d blocks failed", len(pending))
            sink.fail(pending, HubUnavailable(f"fetch failed: {err}"))

    async def _attempt(
        self,
        pending: dict[str, int],
        priority: Priority,
        sink: BlockSink,
        timeout: float,
    ) -> None:
        """One stream for ``pending`` (digest -> size; deadline ``timeout`` seconds);
        removes each digest once it has arrived.

        Arrived blocks are put into the sink by tasks of their own while the stream goes
        on (each admission is a disk write in a worker thread; awaiting them one by one
        held every stream to one block per thread hand-off); the stream reads on only while
        at most :data:`ADMIT_AHEAD_BYTES` of them are being admitted; the attempt returns
        when all of them are done.

        Raises:
            HubUnavailable, CorruptBlock: retry what is left.
            NotFound, InvalidRequest: give up.
        """
        started = time.monotonic()
        first = True
        admitting: dict[asyncio.Task[None], int] = {}
        try:
            async for digest, data in self.source.read_blocks(
                list(pending.items()), timeout, priority
            ):
                if first:
                    sink.first_bytes(time.monotonic() - started, len(data))
                    first = False
                if not (self._verified or isinstance(data, Staged)) and (
                    block_digest(data) != digest
                ):
                    metrics.CORRUPT_BLOCKS.inc()
                    raise CorruptBlock(f"block {digest} failed verification")
                self.deadlines.delivered()
                del pending[digest]
                task = asyncio.create_task(sink.put(digest, data))  # verified now, admitted there
                admitting[task] = len(data)
                task.add_done_callback(admitting.pop)
                while sum(admitting.values()) > ADMIT_AHEAD_BYTES:
                    await asyncio.wait(admitting, return_when=asyncio.FIRST_COMPLETED)
        except HubUnavailable as err:
            log.warning("block fetch failed (%s); retrying", err)
            raise
        finally:
            if admitting:
                await asyncio.wait(list(admitting))
            metrics.HUB_FETCH_SECONDS.observe(time.monotonic() - started)
        if pending:
            raise HubUnavailable(f"stream ended with {len(pending)} blocks missing")
