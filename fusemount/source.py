"""Where a block's bytes come from: its file in the cache, else the daemon.

:meth:`BlockSource.get` is the one flow of a block read. It tries the block file — on the
event loop when the bytes are open, verified and in the page cache (no thread hop:
:meth:`BlockSource.get_cached`, its synchronous first step), else in a worker thread
(open, verify once, ``pread``) — and on a miss asks the daemon
(``EnsureBlocks``, which fetches from the hub; small misses of many readers share calls,
:mod:`fusemount.misses`) and reads the file again. One loop retries,
for two reasons only, until ``--miss-deadline``:

* the daemon went away mid-call (killed, restarting): ask again (``wait_for_ready``
  holds the new call until it is back);
* the daemon says the block is on disk but the file is still missing or unreadable
  (evicted at once, or deleted or damaged on the cache disk): ask again, naming it
  *suspect* so the daemon re-verifies, drops and refetches it.

The daemon answers a miss it could not serve at the deadline (``DEADLINE_EXCEEDED``, having
noted the give-up, so the kernel's next request for the same range, which follows at once,
gets only a short probe): each call may run :data:`ANSWER_MARGIN` past the deadline, so that
answer comes before the call's own timeout, which stays the backstop for a daemon that does
not answer.

Every ``grpc.RpcError`` of a read becomes a :class:`BlockUnavailableError` here and
nowhere else. A block the daemon could not cache (disk full, everything pinned) arrives
inline and is kept in a small in-memory table so the rest of it costs no second fetch.
"""

from __future__ import annotations

import errno
import logging
import time
from collections import OrderedDict

import grpc
import trio

from fusemount.blockfiles import BlockFiles, CorruptBlockError
from fusemount.client import DaemonClient
from fusemount.hits import HitLog
from fusemount.misses import MissBatcher

STREAMED_BLOCKS = 8  # streamed-through blocks kept in memory
FETCH_ATTEMPTS = 3  # "on disk" answers whose file could not be read, before giving up
RETRY_PAUSE = 0.05  # seconds between asking a restarting daemon again
ANSWER_MARGIN = 0.25  # seconds a miss call may outlive the deadline: the daemon answers first
OPEN_FAILURE_S = 2.0
"""How long a fetch that failed at an open (:meth:`BlockSource.fetch`) fails the reads of
that open at once with its error, seconds: the read right after must not wait a second
miss deadline for what the open just waited one for."""

log = logging.getLogger(__name__)

_ERRNO = {grpc.StatusCode.NOT_FOUND: errno.ENOENT}  # the hub lacks the block; else EIO


class BlockUnavailableError(OSError):
    """A block's bytes could not be had: the read fails with ``errno``.

    ``EIO`` when the miss deadline passed, the hub could not deliver or the daemon kept
    reporting a block whose file cannot be read; ``ENOENT`` when the hub lacks it.
    """


class BlockSource:
    """Bytes of blocks by digest, from the cache directory or through the daemon.

    Args:
        files: verified block files of the cache directory.
        client: the daemon connection (``EnsureBlocks``; ``miss_deadline`` in seconds).
        hits: where hits are recorded for the daemon's eviction policy.
        max_threads: most concurrent block-file reads in worker threads.
    """

    def __init__(
        self, files: BlockFiles, client: DaemonClient, hits: HitLog, max_threads: int = 16
    ) -> None:
        self.files = files
        self.client = client
        self.hits = hits
        self.misses = 0
        self.loop_reads = 0  # block-file reads answered on the loop (no thread hop)
        self.thread_reads = 0  # block-file reads done in a worker thread
        self._streamed: OrderedDict[str, bytes] = OrderedDict()
        self._open_failed: OrderedDict[str, tuple[float, BlockUnavailableError]] = OrderedDict()
        self._io_limiter = trio.CapacityLimiter(max_threads)
        self._miss_limiter = trio.CapacityLimiter(64)
        self.batcher = MissBatcher(client, self._miss_limiter)  # small misses share calls

    def get_cached(self, digest: str, offset: int, length: int) -> bytearray | None:
        """The first step of :meth:`get`, synchronous and on the loop: the bytes when the
        block file is open, verified and in the page cache (a hit, recorded), else None.

        The reader tries it before awaiting :meth:`get`, so the common hit costs no
        coroutine and no thread hop.
        """
        data = self.files.read_cached(digest, offset, length)
        if data is not None:
            self.loop_reads += 1
            self.hits.add(digest)
        return data

    async def get(self, digest: str, size: int, offset: int, length: int) -> bytes | bytearray:
        """``length`` bytes at ``offset`` of the ``size``-byte block ``digest``.

        Fewer bytes only at the block's end.

        Raises:
            BlockUnavailableError: a miss could not be served (the errno says why).
        """
        data: bytes | bytearray | None = self.get_cached(digest, offset, length)
        if data is not None:
            return data
        data, suspect = await self._read_file(digest, offset, length)
        if data is not None:
            self.hits.add(digest)
            return data
        failed = self._open_failed.pop(digest, None)
        if failed is not None and time.monotonic() - failed[0] < OPEN_FAILURE_S:
            raise failed[1]  # its open's fetch just failed: not a second deadline
        streamed = self._streamed.get(digest)
        if streamed is not None:
            self._streamed.move_to_end(digest)
            return streamed[offset : offset + length]
        self.misses += 1
        return await self._fetch(digest, size, offset, length, suspect)

    async def _read_file(self, digest: str, offset: int, length: int) -> tuple[bytes | None, bool]:
        """The block file's bytes in a worker thread; (None, suspect) when they are not there."""
        self.thread_reads += 1
        try:
            data = await trio.to_thread.run_sync(
                self.files.read, digest, offset, length, limiter=self._io_limiter
            )
        except CorruptBlockError as err:
            log.error("%s; asking the daemon to refetch it", err)
            self.files.forget(digest)
            return None, True
        return data, False

    async def fetch(self, digest: str, size: int) -> bool:
        """Has the daemon fetch a block this process found missing, without reading it
        (an open that will pass the block file through, :mod:`fusemount.passthrough`);
        counted as a miss.

        Returns:
            True when the block is then cached; False when the daemon streamed it through
            (its bytes are kept here for the reads that follow).

        Raises:
            BlockUnavailableError: the fetch failed (the errno says why); the reads of the
                block in the next :data:`OPEN_FAILURE_S` fail with it at once.
        """
        self.misses += 1
        deadline = time.monotonic() + self.client.miss_deadline
        try:
            uncached = await self._ensure(digest, size, False, deadline)
        except BlockUnavailableError as err:
            self._open_failed[digest] = (time.monotonic(), err)
            while len(self._open_failed) > STREAMED_BLOCKS:
                self._open_failed.popitem(last=False)
            raise
        if digest in uncached:
            self._keep_streamed(digest, uncached[digest])
            return False
        return True

    async def _ensure(
        self, digest: str, size: int, suspect: bool, deadline: float
    ) -> dict[str, bytes]:
        """One block's ``EnsureBlocks`` (shared with other misses), retried while the daemon
        is away until ``deadline``; the blocks it could not cache, by digest."""
        while True:
            try:
                return await self.batcher.ensure(
                    digest,
                    size,
                    suspect,
                    max(deadline - time.monotonic(), 0.001) + ANSWER_MARGIN,
                )
            except grpc.RpcError as err:
                if err.code() == grpc.StatusCode.UNAVAILABLE and time.monotonic() < deadline:
                    await trio.sleep(RETRY_PAUSE)  # the daemon went away mid-call
                    continue
                raise BlockUnavailableError(
                    _ERRNO.get(err.code(), errno.EIO), f"block {digest}: {_describe(err)}"
                ) from err

    async def _fetch(
        self, digest: str, size: int, offset: int, length: int, suspect: bool
    ) -> bytes | bytearray:
        deadline = time.monotonic() + self.client.miss_deadline
        unreadable = 0
        while True:
            uncached = await self._ensure(digest, size, suspect, deadline)
            if digest in uncached:
                self._keep_streamed(digest, uncached[digest])
                return uncached[digest][offset : offset + length]
            data, suspect = await self._read_file(digest, offset, length)
            if data is not None:
                return data
            unreadable += 1
            if unreadable >= FETCH_ATTEMPTS:
                raise BlockUnavailableError(
                    errno.EIO,
                    f"block {digest} is on the daemon's disk but could not be read here "
                    f"{FETCH_ATTEMPTS} times",
                )
            log.info("block %s missing or unreadable after its fetch; asking again", digest)
            suspect = True  # the daemon re-verifies it: a deleted file is dropped and refetched

    def _keep_streamed(self, digest: str, data: bytes) -> None:
        self._streamed[digest] = data
        while len(self._streamed) > STREAMED_BLOCKS:
            self._streamed.popitem(last=False)

    async def warm(self, blocks: list[tuple[str, int]], source: int) -> None:
        """Readahead (best effort): cached blocks are read into the page cache in the
        background (``WILLNEED``), missing ones are fetched by the daemon (``Prefetch``,
        as ``source``: a ``spoke_pb2.PrefetchSource``)."""
        await trio.to_thread.run_sync(self._warm, blocks, source, limiter=self._miss_limiter)

    def _warm(self, blocks: list[tuple[str, int]], source: int) -> None:
        missing = [(d, s) for d, s in blocks if not self.files.warm(d)]
        if missing:
            self.client.prefetch(missing, source)


def _describe(err: grpc.RpcError) -> str:
    code = err.code() if hasattr(err, "code") else None
    details = err.details() if hasattr(err, "details") else ""
    return f"{code.name if code else 'RpcError'}: {details}"
