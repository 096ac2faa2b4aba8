"""Cross-file readahead: a reader that opens a snapshot's files in manifest order (a Zarr
chunk directory, ``cat dir/*``, a copy, fio over a directory) gets the next files fetched
ahead of it.

The in-file readahead (:mod:`fusemount.readahead`) works inside one open file; a Zarr
chunk file is usually a single block, so a reader walking a chunk directory would wait a
round trip per file. Detection is **per reader**: the kernel names the process (thread)
behind every ``open`` (``pyfuse3.RequestContext.pid``), and the mount sees each reader's
opens in the order it makes them, so a walk is what one reader does, never what several
readers' reads happen to look like side by side. A shuffled epoch — every file once, in
random order — has no run, however many readers share the mount.

The window follows the same on-demand scheme as the in-file one (Linux mm/readahead.c;
Fengguang Wu, "On-demand readahead", Linux Symposium 2007), with files for pages: a *run*
starts when one reader has opened ``confirm + 1`` files each the one right after the
previous (strictly: any other open by that reader, except the same file again, ends the
run); its first window is the next ``initial_files`` files; opening the first file of the
last window (the *marker*) requests the next window right after it, twice as many bytes,
up to ``max_bytes``. So the reader always has between one and two windows ahead of it. Of
each file only its first ``head_blocks`` blocks are asked for: the in-file readahead
takes over once the reader reads it. A window is cut to the room the daemon last said
this source has (its prefetch budget, the cache's room, the source's window in the
prefetch ledger): files past it stay ahead of the run and go with its next window,
instead of being asked for, dropped, and missed.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from fusemount.tree import Node

Block = tuple[str, int]


@dataclass(eq=False)
class _Run:
    snapshot: str  # snapshot id
    last: int  # position last opened
    steps: int = 0  # opens that each followed the previous one
    window: int = 0  # bytes of the last window (0: not started)
    ahead_to: int = -1  # highest position requested
    marker: int = 0  # opening this position requests the next window


class CrossFileReadahead:
    """Per reader, detects in-order walks over a snapshot's files.

    Args:
        initial_files: files in a run's first window.
        max_bytes: largest window, bytes.
        head_blocks: blocks asked for of each file ahead.
        confirm: in-order opens before a run prefetches (a random reader that opens two
            neighbouring chunks by chance must not drag in a third).
        max_readers: readers tracked at once (the least recently seen one is dropped).
    """

    def __init__(
        self,
        initial_files: int = 2,
        max_bytes: int = 32 << 20,
        head_blocks: int = 2,
        confirm: int = 2,
        max_readers: int = 64,
    ) -> None:
        self.initial_files = initial_files
        self.max_bytes = max_bytes
        self.head_blocks = head_blocks
        self.confirm = confirm
        self.max_readers = max_readers
        self._runs: OrderedDict[int, _Run] = OrderedDict()  # reader -> its run
        self.windows = 0  # windows asked for since start
        self.blocks = 0  # blocks in them

    @property
    def readers(self) -> int:
        """Readers being tracked."""
        return len(self._runs)

    def on_open(
        self, reader: int, node: Node, files: Sequence[Node], room: int = 1 << 62
    ) -> list[Block]:
        """Account for ``reader`` (a pid) opening ``node``, at ``node.position`` of
        ``files`` (its snapshot's files in manifest order); returns the blocks to
        prefetch now (often none), at most ``room`` bytes of them (what the daemon
        takes now): files past it stay ahead, for the next window."""
        pos = node.position
        if pos < 0 or pos >= len(files) or files[pos].inode != node.inode:
            return []  # not a file of a loaded snapshot's order
        run = self._runs.get(reader)
        if run is None or run.snapshot != node.snapshot_id:
            run = self._start(reader, node.snapshot_id, pos)
            return []
        self._runs.move_to_end(reader)
        if pos == run.last:  # the same file again (a second open, a re-read)
            return []
        if pos != run.last + 1:  # a jump: whatever this reader does, it is no walk now
            self._start(reader, node.snapshot_id, pos)
            return []
        run.steps += 1
        run.last = pos
        if run.window == 0:
            if run.steps < self.confirm:
                run.ahead_to = pos
                return []
            stop = min(len(files), pos + 1 + self.initial_files)
            run.window = sum(self._head_bytes(files[i]) for i in range(pos + 1, stop)) or 1
        elif pos >= run.marker:
            run.window = min(run.window * 2, self.max_bytes)
        else:
            return []
        return self._issue(run, files, max(run.ahead_to, pos) + 1, room)

    def _start(self, reader: int, snapshot: str, pos: int) -> _Run:
        run = _Run(snapshot, pos, ahead_to=pos)
        self._runs[reader] = run
        self._runs.move_to_end(reader)
        while len(self._runs) > self.max_readers:
            self._runs.popitem(last=False)
        return run

    def _issue(self, run: _Run, files: Sequence[Node], start: int, room: int) -> list[Block]:
        blocks: list[Block] = []
        total = 0
        end = start
        want = min(run.window, room)
        while end < len(files) and total < want:
            head = list(files[end].blocks[: self.head_blocks])
            size = sum(s for _, s in head)
            if blocks and total + size > want:
                break
            blocks += head
            total += size
            end += 1
        if not blocks:
            return []
        run.ahead_to = end - 1
        run.marker = start
        self.windows += 1
        self.blocks += len(blocks)
        return blocks

    def _head_bytes(self, node: Node) -> int:
        return sum(size for _, size in node.blocks[: self.head_blocks])
