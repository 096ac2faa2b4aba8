"""Reads file bytes: a FUSE byte range becomes block ranges, each served by the block source.

A read of ``size`` bytes at ``offset`` covers one or more blocks of the file's manifest
entry; :meth:`BlockReader.read` asks :class:`~fusemount.source.BlockSource` for each
covered part (block file, else the daemon) and feeds the open file's readahead; each open
feeds the opening reader's cross-file readahead (:mod:`fusemount.crossfile`). One
background task serves both kinds of windows. The reader also runs the mount's two housekeeping
tasks: hit reports (:class:`~fusemount.hits.HitLog`) and the sweep that closes block files
the daemon has evicted.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import trio

from fusemount.blockfiles import BlockFiles
from fusemount.client import DaemonClient
from fusemount.crossfile import CrossFileReadahead
from fusemount.hits import HitLog
from fusemount.readahead import Readahead
from fusemount.source import BlockSource
from fusemount.tree import Node
from protocol.spoke.v1 import spoke_pb2
from spoke.disk.encryption import BlockCipher
from spoke.disk.layout import CacheLayout

READAHEAD_QUEUE = 64  # readahead windows waiting; a full queue drops new ones
IN_FILE = spoke_pb2.PREFETCH_SOURCE_READAHEAD
CROSS_FILE = spoke_pb2.PREFETCH_SOURCE_CROSSFILE
UNKNOWN_ROOM = 1 << 62  # before the daemon's first answer: windows as large as they grow

log = logging.getLogger(__name__)


class BlockReader:
    """Serve byte ranges of files in snapshots.

    Args:
        layout: the spoke cache directory (read-only use).
        client: the daemon connection for misses and access records.
        max_threads: most concurrent block-file reads in worker threads.
        cipher: the key of block files encrypted at rest (None: plain block files).
    """

    def __init__(
        self,
        layout: CacheLayout,
        client: DaemonClient,
        max_threads: int = 16,
        cipher: BlockCipher | None = None,
    ) -> None:
        self.layout = layout
        self.client = client
        self.files = BlockFiles(layout, cipher=cipher)
        self.hit_log = HitLog(client)
        self.source = BlockSource(self.files, client, self.hit_log, max_threads)
        self.crossfile = CrossFileReadahead()
        self._pending: dict[int, int] = {}  # source -> bytes queued, not yet answered
        self._ahead_send, self._ahead_recv = trio.open_memory_channel[
            tuple[list[tuple[str, int]], int]
        ](READAHEAD_QUEUE)

    @property
    def hits(self) -> int:
        """Reads served from block files since start."""
        return self.hit_log.count

    @property
    def misses(self) -> int:
        """Block reads that needed the daemon since start."""
        return self.source.misses

    async def read(
        self, node: Node, offset: int, size: int, readahead: Readahead | None = None
    ) -> bytes | bytearray:
        """Up to ``size`` bytes of ``node`` from ``offset`` (empty at or past EOF).

        Args:
            readahead: the open file's readahead state; blocks it asks for are queued for
                prefetching (dropped if the queue is full: readahead is advisory).

        Raises:
            BlockUnavailableError: a miss could not be served (the boundary maps its errno).
        """
        if offset >= node.size or size <= 0:
            return b""
        end = min(offset + size, node.size)
        bs = node.block_size
        first, last = offset // bs, (end - 1) // bs
        if readahead is not None and len(node.blocks) > 1:
            room = self.readahead_room(IN_FILE) // bs
            ahead = readahead.on_range(offset, end, bs, len(node.blocks), room)
            if ahead:
                self._queue([node.blocks[i] for i in ahead], IN_FILE)
        if first == last:  # the common case: one block, no join
            digest, block_len = node.blocks[first]
            in_block = offset - first * bs
            hot = self.source.get_cached(digest, in_block, end - offset)  # a page-cached hit
            if hot is not None:
                return hot
            return await self.source.get(digest, block_len, in_block, end - offset)
        parts: list[bytes | bytearray] = []
        pos = offset
        while pos < end:
            index = pos // bs
            digest, block_len = node.blocks[index]
            in_block = pos - index * bs
            want = min(end - pos, block_len - in_block)
            data = await self.source.get(digest, block_len, in_block, want)
            parts.append(data)
            pos += len(data)
            if len(data) < want:  # block file shorter than the manifest says: stop
                break
        return b"".join(parts)

    def opened(self, node: Node, reader: int, files: Sequence[Node]) -> None:
        """``reader`` (the pid the kernel gave) opened ``node``, a file of ``files`` (its
        snapshot's, in manifest order): cross-file readahead, queued like any window.
        Off while a read-order hint is installed (the daemon's answers say ``prompt``):
        the hint knows what comes next, a guess could only take its room."""
        if self.client.prompt:
            return
        ahead = self.crossfile.on_open(reader, node, files, self.readahead_room(CROSS_FILE))
        if ahead:
            self._queue(ahead, CROSS_FILE)

    def readahead_room(self, source: int) -> int:
        """Bytes ``source`` may still ask the daemon for (its last answer, less what was
        queued since): windows are cut to it, so the rest stays ahead of the reader for
        its next window instead of being asked for, dropped, and missed."""
        room = self.client.readahead_room.get(source, UNKNOWN_ROOM)
        return max(0, room - self._pending.get(source, 0))

    def _queue(self, blocks: list[tuple[str, int]], source: int) -> None:
        try:
            self._ahead_send.send_nowait((blocks, source))
        except trio.WouldBlock:  # full: dropped (readahead is advisory)
            return
        self._pending[source] = self._pending.get(source, 0) + sum(s for _, s in blocks)

    async def prefetch_forever(self) -> None:
        """Serve queued readahead windows one at a time (best effort)."""
        async for blocks, source in self._ahead_recv:
            try:
                await self.source.warm(blocks, source)
            except Exception as err:  # the daemon may be restarting; readahead is advisory
                log.debug("readahead of %d blocks not done: %s", len(blocks), err)
            finally:
                self._pending[source] -= sum(s for _, s in blocks)

    async def flush_hits_forever(self, interval: float = 0.1, sweep_every: float = 0.5) -> None:
        """Report hits (see :class:`~fusemount.hits.HitLog`) and, every ``sweep_every``
        seconds, close open block files the daemon has evicted since (best effort)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.hit_log.report_forever, interval)
            while True:
                await trio.sleep(sweep_every)
                await trio.to_thread.run_sync(self.files.sweep)

    async def flush_hits(self) -> None:
        """Report the hits gathered so far (at shutdown)."""
        await self.hit_log.report()
