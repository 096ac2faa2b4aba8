"""``user.strata.cached_bytes``: how many of a file's bytes are in the cache now, counted
from the block files on disk — bounded per file and in all, so no reader can make the
mount's threads do more than one count at a time.

A count stats each distinct block of the file (a 2 GiB file at 64 KiB blocks: 32,768
stats, about 0.6 s of CPU as it was written, every call). Any user who may read a file may
ask, and before, 48 such loops of an unprivileged user kept the mount's worker threads —
the ones opens verify block files on — busy statting, and everyone's opens took 40-60
times longer (issue 39's seventeenth probe). Here a file's count is kept for
:data:`FRESH_S` (callers meanwhile get it without work), counts run one at a time on a
thread of their own (never one the opens wait for), distinct blocks are statted once,
and the path is built as a string, not a :class:`~pathlib.Path`.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Callable

import trio

from fusemount.tree import Node

FRESH_S = 1.0
"""How long a file's count is answered without counting again, seconds."""

KEPT = 4096
"""Most files whose counts are kept (the least recently counted dropped first)."""


class CachedBytes:
    """Counts of a file's cached bytes (see the module docstring).

    Args:
        blocks_dir: The cache's block directory (``BLOCKS/<2 hex>/<digest>``).
        clock: Monotonic seconds (tests pass their own).

    Not thread-safe: the mount's trio loop owns it.
    """

    def __init__(self, blocks_dir: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._blocks_dir, self._clock = blocks_dir, clock
        self._counted: OrderedDict[int, tuple[float, int]] = OrderedDict()  # inode -> (at, bytes)
        self._one = trio.Lock()  # one count at a time, whoever asks
        self._thread = trio.CapacityLimiter(1)  # its own thread, not the opens'
        self.counts = 0  # counts made (for tests and the curious)

    async def of(self, node: Node) -> int:
        """Bytes of ``node`` (a regular file) whose blocks are in the cache, as of at most
        :data:`FRESH_S` ago."""
        fresh = self._fresh(node.inode)
        if fresh is not None:
            return fresh
        async with self._one:
            fresh = self._fresh(node.inode)  # counted while this caller waited
            if fresh is not None:
                return fresh
            count = await trio.to_thread.run_sync(self._count, node.blocks, limiter=self._thread)
            self.counts += 1
            self._counted[node.inode] = (self._clock(), count)
            self._counted.move_to_end(node.inode)
            while len(self._counted) > KEPT:
                self._counted.popitem(last=False)
            return count

    def _fresh(self, inode: int) -> int | None:
        kept = self._counted.get(inode)
        if kept is None or self._clock() - kept[0] > FRESH_S:
            return None
        return kept[1]

    def _count(self, blocks: tuple[tuple[str, int], ...]) -> int:
        """Bytes of ``blocks`` whose block files exist (a stat per distinct block)."""
        present: dict[str, bool] = {}
        total = 0
        for digest, size in blocks:
            here = present.get(digest)
            if here is None:
                path = f"{self._blocks_dir}/{digest[:2]}/{digest}"
                here = present[digest] = os.path.exists(path)
            if here:
                total += size
        return total
