"""Adaptive sequential readahead for one open file.

Modelled on Linux's on-demand readahead (mm/readahead.c; Fengguang Wu, "On-demand
readahead", Linux Symposium 2007): a file read in order gets a window of blocks fetched
ahead of the reader; the window starts small, doubles each time the reader catches up with
the second half of what was prefetched, and resets on a seek. Here the unit is the cache
block (default 4 MiB) and the fetches are prefetch requests to the spoke daemon, which
bounds how many bytes are in flight.
"""

from __future__ import annotations

from dataclasses import dataclass

SKIP = 1 << 20  # bytes an in-order read may start past the previous read's end
_NOTHING = range(0)


@dataclass
class Readahead:
    """Readahead state of one open file handle.

    A read that follows the previous one (in the same block or the next) is sequential;
    any other read is a seek and prefetches nothing (zarr's random chunk reads must not
    drag in neighbours), and neither does a handle's first read, even at block 0: a run is
    confirmed only by two consecutive reads (a reader that opens files to read their first
    bytes, in any order, fetches nothing ahead). After a window of blocks ``a..b`` is
    requested, reaching block ``a`` (the *marker*, like the kernel's PG_readahead page)
    requests the next window, twice as large, right after ``b``; so the reader always has
    between one and two windows in flight ahead of it.

    Args:
        initial: window after a seek or at the first read, blocks.
        maximum: largest window, blocks.
    """

    initial: int = 2
    maximum: int = 32
    window: int = 0
    next_offset: int = 0  # where an in-order read starts: the previous read's end, bytes
    last_block: int = -1  # the block the previous read ended in (-1: no read yet)
    ahead_to: int = -1  # highest block index already requested
    marker: int = 0  # reading this block requests the next window

    def on_range(
        self, offset: int, end: int, block_size: int, blocks: int, room: int | None = None
    ) -> range:
        """Account for a read of bytes ``offset..end`` (exclusive) of a file of ``blocks``
        blocks of ``block_size`` bytes; returns the block indexes to prefetch now (at most
        ``room`` of them: what the daemon takes now; the rest go with the next window).

        In order means starting at the previous read's end, or at most :data:`SKIP` bytes
        past it (the kernel skips pages it already holds), as Linux judges by page and
        not by block: random reads that happen to land in the block just read are
        seeks, not a sequential stream.
        """
        in_order = 0 <= offset - self.next_offset <= SKIP
        self.next_offset = end
        last = (end - 1) // block_size
        if not in_order:  # a seek: what on_read does for one, without the call
            self.window = 0
            self.last_block = self.ahead_to = last
            return _NOTHING
        return self.on_read(offset // block_size, last, blocks, room)

    def on_read(self, first: int, last: int, blocks: int, room: int | None = None) -> range:
        """Account for a read of blocks ``first..last`` of a ``blocks``-block file.

        Returns:
            The block indexes to prefetch now (possibly empty; at most ``room``).
        """
        follows = self.last_block >= 0 and first in (self.last_block, self.last_block + 1)
        self.last_block = last
        if not follows:  # a seek (or the first read): a lone random read prefetches nothing
            self.window = 0
            self.ahead_to = last
            return range(0)
        if self.window == 0:  # sequential from here on: start with a small window
            self.window = self.initial
        elif last >= self.marker:
            self.window = min(self.window * 2, self.maximum)
        else:
            return range(0)
        start = max(self.ahead_to, last) + 1
        stop = min(start + self.window, blocks, start + (self.window if room is None else room))
        if start >= stop:
            return range(0)
        self.ahead_to = stop - 1
        self.marker = start
        return range(start, stop)
