"""The fetcher: runs one batch of block fetches against a :class:`~spoke.fetch.source.BlockSource`.

A batch is one stream from the source, carrying a per-stream deadline and retried with
exponential backoff and jitter (tenacity) until the miss deadline; each retry asks only for
what has not arrived. Every block is verified against its digest before it is admitted; a
mismatch is counted and refetched. A block the cache cannot hold (disk full, everything
pinned) is handed on in memory instead (stream-through). What to fetch, when, and who waits
for it is the scheduler's business (:mod:`spoke.fetch.scheduler`); the fetcher reports each
block's arrival and outcome to a :class:`FetchListener`. It owns every deadline
(:mod:`spoke.fetch.deadlines`): its batches', and a reader's wait (:meth:`Fetcher.wait`),
which the scheduler asks for instead of reading the fetcher's state.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence
from typing import Protocol

from spoke import metrics
from spoke.cache.blockcache import BlockCache, CacheFull, Placement, PrefetchRefused
from spoke.cache.staging import Staged
from spoke.cache.store import Received
from spoke.disk.layout import block_digest
from spoke.errors import CorruptBlock, HubUnavailable, MissDeadline, SpokeError
from spoke.fetch.deadlines import RETRIED, Deadlines, ReaderWait
from spoke.fetch.priority import Priority
from spoke.fetch.source import BlockSource

log = logging.getLogger(__name__)

ADMIT_AHEAD_BYTES = 16 << 20
"""Most bytes of one stream's arrived blocks waiting for their disk writes at once."""


class FetchListener(Protocol):
    """What the fetcher tells about a batch as it goes."""

    def first_bytes(self, seconds: float, nbytes: int) -> None:
        """A stream's first block (``nbytes``) arrived ``seconds`` after it was opened."""

    def arrived(self, digest: str, nbytes: int) -> None:
        """A block arrived and was verified (its admission follows)."""

    def resolved(self, digest: str, error: BaseException | None, data: bytes | None) -> None:
        """A block is done: resident (``data`` None), streamed through (``data``), or
        failed (``error``)."""

    def placement(self, digest: str) -> Placement:
        """How an arrived block is admitted: for a reader, or ahead of any."""


class Fetcher:
    """Fetch batches of blocks from a source into the cache.

    Args:
        source: where blocks come from.
        cache: where they go.
        miss_deadline: how long a batch may keep retrying before it fails, and a reader
            may wait, seconds.
        stream_timeout: deadline of one stream, seconds.
    """

    def __init__(
        self,
        source: BlockSource,
        cache: BlockCache,
        miss_deadline: float = 60.0,
        stream_timeout: float = 60.0,
    ) -> None:
        self.source = source
        self.cache = cache
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
        self, blocks: Sequence[tuple[str, int]], priority: Priority, listener: FetchListener
    ) -> None:
        """Fetch ``(digest, size)`` of class ``priority`` until each is resolved (never
        raises, except on cancellation: then the blocks not yet resolved are left to the
        caller)."""
        pending = dict(blocks)
        retrying, stream_timeout = self.deadlines.attempts()
        try:
            async for attempt in retrying:
                with attempt:
                    await self._attempt(pending, priority, listener, stream_timeout())
        except RETRIED as err:
            miss_deadline = self.deadlines.miss_deadline
            error = MissDeadline(
                f"{self.source.name} did not deliver within {miss_deadline:g} s: {err}"
            )
            self.deadlines.gave_up(pending, error)
            self._fail(pending, error, listener)
        except SpokeError as err:  # NotFound, InvalidRequest: another attempt cannot help
            self._fail(pending, err, listener)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # never leave a waiter hanging
            log.exception("fetch of %d blocks failed", len(pending))
            self._fail(pending, HubUnavailable(f"fetch failed: {err}"), listener)

    async def _attempt(
        self,
        pending: dict[str, int],
        priority: Priority,
        listener: FetchListener,
        timeout: float,
    ) -> None:
        """One stream for ``pending`` (digest -> size; deadline ``timeout`` seconds);
        removes each digest once it has arrived.

        Arrived blocks are admitted by tasks of their own while the stream goes on (each
        admission is a disk write in a worker thread; awaiting them one by one held every
        stream to one block per thread hand-off), at most :data:`ADMIT_AHEAD_BYTES` of
        them at once; the attempt returns when all of them are done.

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
                    listener.first_bytes(time.monotonic() - started, len(data))
                    first = False
                if not (self._verified or isinstance(data, Staged)) and (
                    block_digest(data) != digest
                ):
                    metrics.CORRUPT_BLOCKS.inc()
                    raise CorruptBlock(f"block {digest} failed verification")
                self.deadlines.delivered()
                del pending[digest]
                listener.arrived(digest, len(data))
                while admitting and sum(admitting.values()) + len(data) > ADMIT_AHEAD_BYTES:
                    await asyncio.wait(admitting, return_when=asyncio.FIRST_COMPLETED)
                task = asyncio.create_task(self._admit(digest, data, listener))
                admitting[task] = len(data)
                task.add_done_callback(admitting.pop)
        except HubUnavailable as err:
            log.warning("block fetch failed (%s); retrying", err)
            raise
        finally:
            if admitting:
                await asyncio.wait(list(admitting))
            metrics.HUB_FETCH_SECONDS.observe(time.monotonic() - started)
        if pending:
            raise HubUnavailable(f"stream ended with {len(pending)} blocks missing")

    async def _admit(self, digest: str, data: Received, listener: FetchListener) -> None:
        """Cache a verified block and resolve it; never raises.

        A block the cache cannot take (disk full with nothing evictable, or a failed
        write) is resolved with its bytes instead, so readers waiting for it still succeed
        (a staged block's are read back from its file, which is then deleted).
        """
        try:
            await self.cache.admit(digest, data, listener.placement(digest))
        except PrefetchRefused as err:  # nobody waits for it: the cache is under pressure
            log.debug("%s", err)
            await self._through(digest, data, listener)
            return
        except CacheFull as err:
            log.warning("%s; streaming the block through uncached", err)
            metrics.STREAMED_THROUGH.inc()
            await self._through(digest, data, listener)
            return
        except Exception:
            log.exception("could not cache block %s; streaming it through uncached", digest)
            metrics.STREAMED_THROUGH.inc()
            await self._through(digest, data, listener)
            return
        listener.resolved(digest, None, None)

    async def _through(self, digest: str, data: Received, listener: FetchListener) -> None:
        """Resolves a block the cache did not take with its bytes, as ``bytes`` (a source
        may hand over a ``bytearray`` it received in place, or a staged file)."""
        if isinstance(data, Staged):
            staged = data
            try:
                data = await asyncio.to_thread(self.cache.store.read_staged, staged)
            except Exception as err:  # its file is gone or unreadable: the readers retry
                listener.resolved(digest, HubUnavailable(f"block {digest} lost: {err}"), None)
                return
            finally:
                staged.discard()
        listener.resolved(digest, None, data if type(data) is bytes else bytes(data))

    @staticmethod
    def _fail(digests: Iterable[str], error: BaseException, listener: FetchListener) -> None:
        for digest in list(digests):
            listener.resolved(digest, error, None)
