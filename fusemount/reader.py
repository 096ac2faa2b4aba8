"""Reads file bytes: hits straight from block files, misses through the daemon.

A FUSE read of ``size`` bytes at ``offset`` covers one or more blocks. Each covered block
is read from its (verified) file in the cache directory — a hit, no daemon round trip; a
block that is not there is requested from the daemon (``EnsureBlocks``, which fetches it
from the hub) and then read from its file. A block file that fails verification is reported
to the daemon as suspect, which drops and refetches it. A block the daemon could not cache
(disk full, everything pinned) arrives inline and is kept in a small in-memory table so the
rest of it does not cost another fetch. Hits are reported to the daemon in batches so its
eviction policy sees every access. All file and socket I/O runs in worker threads, never on
the trio loop.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import OrderedDict

import trio

from fusemount.blockfiles import BlockFiles, CorruptBlockError
from fusemount.client import DaemonClient
from fusemount.readahead import Readahead
from fusemount.tree import Node
from spoke.layout import CacheLayout

STREAMED_BLOCKS = 8  # streamed-through blocks kept in memory
HIT_BATCH = 64  # hits that make a report go out before its interval is up
FETCH_ATTEMPTS = 3  # a block evicted between its fetch and its read is fetched again

log = logging.getLogger(__name__)


class MissingBlockError(OSError):
    """A block was still absent after the daemon reported it resident (evicted at once)."""


class BlockReader:
    """Serve byte ranges of files in snapshots.

    Args:
        layout: the spoke cache directory (read-only use).
        client: the daemon connection for misses and access records.
        max_threads: most concurrent block-file reads.
    """

    def __init__(self, layout: CacheLayout, client: DaemonClient, max_threads: int = 16) -> None:
        self.layout = layout
        self.files = BlockFiles(layout)
        self.client = client
        self._streamed: OrderedDict[str, bytes] = OrderedDict()
        self._prefetch_send, self._prefetch_recv = trio.open_memory_channel[list[tuple[str, int]]](
            64
        )
        self._io_limiter = trio.CapacityLimiter(max_threads)
        self._miss_limiter = trio.CapacityLimiter(64)
        self._lock = threading.Lock()
        self._hits: list[str] = []
        self._hits_full = trio.Event()
        self.hits = 0
        self.misses = 0

    async def read(
        self, node: Node, offset: int, size: int, readahead: Readahead | None = None
    ) -> bytes:
        """Up to ``size`` bytes of ``node`` from ``offset`` (empty at or past EOF).

        Args:
            readahead: the open file's readahead state; blocks it asks for are queued for
                prefetching (dropped if the queue is full: readahead is advisory).

        Raises:
            grpc.RpcError: a miss could not be served (mapped to an errno by the boundary).
        """
        if offset >= node.size or size <= 0:
            return b""
        end = min(offset + size, node.size)
        bs = node.block_size
        if readahead is not None and len(node.blocks) > 1:
            ahead = readahead.on_read(offset // bs, (end - 1) // bs, len(node.blocks))
            if ahead:
                with contextlib.suppress(trio.WouldBlock):
                    self._prefetch_send.send_nowait([node.blocks[i] for i in ahead])
        parts: list[bytes] = []
        pos = offset
        while pos < end:
            index = pos // bs
            digest, block_len = node.blocks[index]
            in_block = pos - index * bs
            want = min(end - pos, block_len - in_block)
            data = await self._read_block(digest, block_len, in_block, want)
            parts.append(data)
            pos += len(data)
            if len(data) < want:  # block file shorter than the manifest says: stop
                break
        return b"".join(parts)

    async def _read_block(self, digest: str, block_len: int, offset: int, size: int) -> bytes:
        suspect = False
        try:
            data = await trio.to_thread.run_sync(
                self.files.read, digest, offset, size, limiter=self._io_limiter
            )
        except CorruptBlockError as err:
            log.error("%s; asking the daemon to refetch it", err)
            self.files.forget(digest)
            data, suspect = None, True
        if data is not None:
            with self._lock:
                self.hits += 1
                self._hits.append(digest)
                if len(self._hits) >= self._report_after():
                    self._hits_full.set()
            return data
        streamed = self._streamed.get(digest)
        if streamed is not None:
            self._streamed.move_to_end(digest)
            return streamed[offset : offset + size]
        self.misses += 1
        for _attempt in range(FETCH_ATTEMPTS):
            uncached = await trio.to_thread.run_sync(
                self.client.ensure_blocks,
                [(digest, block_len)],
                [digest] if suspect else [],
                limiter=self._miss_limiter,
            )
            suspect = False
            if digest in uncached:
                self._streamed[digest] = uncached[digest]
                while len(self._streamed) > STREAMED_BLOCKS:
                    self._streamed.popitem(last=False)
                return uncached[digest][offset : offset + size]
            data = await trio.to_thread.run_sync(
                self.files.read, digest, offset, size, limiter=self._io_limiter
            )
            if data is not None:
                return data
            log.info("block %s was evicted before it could be read; fetching it again", digest)
        raise MissingBlockError(
            f"block {digest} was evicted {FETCH_ATTEMPTS} times between its fetch and its read"
        )

    def cached_bytes(self, node: Node) -> int:
        """Bytes of ``node`` whose blocks are in the cache now (a stat per block)."""
        return sum(size for digest, size in node.blocks if self.layout.block_path(digest).exists())

    def take_hits(self) -> list[str]:
        """Hits since the last call (the access-record batch)."""
        with self._lock:
            hits, self._hits = self._hits, []
        return hits

    async def prefetch_forever(self) -> None:
        """Serve queued readahead (best effort), one window at a time: cached blocks are
        read into the page cache in the background, missing ones are fetched by the daemon."""
        async for blocks in self._prefetch_recv:
            try:
                await trio.to_thread.run_sync(self._readahead, blocks, limiter=self._miss_limiter)
            except Exception as err:  # the daemon may be restarting; readahead is advisory
                log.debug("readahead of %d blocks not done: %s", len(blocks), err)

    def _readahead(self, blocks: list[tuple[str, int]]) -> None:
        missing = [(d, s) for d, s in blocks if not self.files.warm(d)]
        if missing:
            self.client.prefetch(missing)

    async def flush_hits_forever(self, interval: float = 0.1, sweep_every: float = 0.5) -> None:
        """Report batched hits to the daemon every ``interval`` seconds, or as soon as
        :data:`HIT_BATCH` have gathered, and every ``sweep_every`` seconds close open
        block files the daemon has evicted since (best effort).

        While the daemon answers that a read-order hint is installed, hits go out as they
        happen instead: one report in flight, the next carrying whatever gathered
        meanwhile, so the hint's cursors follow the reads (a report 0.1 s late let a fast
        reader's hits look unread, and the daemon kept their blocks in place of ones it
        needed).
        """
        next_sweep = trio.current_time() + sweep_every
        while True:
            with trio.move_on_after(interval):
                await self._hits_full.wait()
            self._hits_full = trio.Event()
            await self.flush_hits()
            if trio.current_time() >= next_sweep:
                next_sweep = trio.current_time() + sweep_every
                await trio.to_thread.run_sync(self.files.sweep, limiter=self._io_limiter)

    async def flush_hits(self) -> None:
        """Report the hits gathered so far; a failed report is logged and dropped."""
        hits = self.take_hits()
        if not hits:
            return
        try:
            await trio.to_thread.run_sync(self.client.record_access, hits)
        except Exception as err:  # the daemon may be restarting; recency is advisory
            log.debug("could not report %d hits: %s", len(hits), err)
            return
        with self._lock:
            if len(self._hits) >= self._report_after():
                self._hits_full.set()

    def _report_after(self) -> int:
        """Hits that make a report go out now: 1 while the daemon asks for prompt reports."""
        return 1 if self.client.prompt else HIT_BATCH
