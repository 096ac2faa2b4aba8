"""Cross-file readahead: a reader that reads a snapshot's files in manifest order (a Zarr
chunk directory, ``cat dir/*``, a copy, fio over a directory) gets the next files fetched
ahead of it.

The mount's readahead (``fusemount/readahead.py``) works inside one open file; a Zarr chunk
file is usually a single block, so a reader walking a chunk directory waited a round trip
per file. The daemon sees every read (hit or miss) through the access log and knows the
loaded manifests (:class:`spoke.snapshots.SnapshotIndex`), so it detects the walk here.

The window follows the same on-demand scheme as the in-file one (Linux mm/readahead.c;
Fengguang Wu, "On-demand readahead", Linux Symposium 2007), with files for pages: a *run*
starts when a reader has read ``confirm`` files each right after the previous one; its
first window is the next ``initial_files`` files; reading the first file of the last
window (the *marker*) requests the next window right after it, twice as many bytes, up to
``max_bytes``. So a reader always has between one and two windows ahead of it. Of each
file only its first ``head_blocks`` blocks are fetched: the mount's in-file readahead
takes over once the reader opens it. Several readers walking at once (fio's workers, a
DataLoader's) each get a run; a read that continues no run starts a candidate.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from spoke.scheduler import FetchScheduler, Priority
from spoke.snapshots import IndexedSnapshot, SnapshotIndex

SLACK = 8
"""Positions a read may trail a run's last read and still belong to it (hits are reported
in batches, misses at once, so a run's reads can arrive a little out of order)."""

GAP = 16
"""Most reads (of anything) between two in-order reads of one run: a walk's next file
comes soon; a random reader reaching a neighbour much later is no walk."""


@dataclass(eq=False)
class _Run:
    snapshot: IndexedSnapshot
    last: int  # position last read
    steps: int = 0  # reads that each followed the previous one
    window: int = 0  # bytes of the last window (0: not started)
    ahead_to: int = -1  # highest position requested
    marker: int = 0  # reading this position requests the next window
    touched: float = 0.0
    tick: int = 0  # the read count at the run's last read


class CrossFileReadahead:
    """Detects in-order walks over a snapshot's files and prefetches the next files.

    Args:
        index: the loaded manifests.
        scheduler: prefetches go out as :attr:`Priority.READAHEAD`.
        initial_files: files in a run's first window.
        max_bytes: largest window, bytes.
        head_blocks: blocks fetched of each file ahead.
        confirm: in-order reads before a run prefetches (a random reader that touches two
            neighbouring chunks must not drag in a third).
        max_runs: runs tracked at once (the least recently used one is dropped).
        paused: while it returns True nothing is prefetched (a read-order hint is
            installed: the hint knows what comes next, a guess could only evict it).
        clock: monotonic seconds.
    """

    def __init__(
        self,
        index: SnapshotIndex,
        scheduler: FetchScheduler,
        initial_files: int = 2,
        max_bytes: int = 32 << 20,
        head_blocks: int = 2,
        confirm: int = 2,
        max_runs: int = 32,
        paused: Callable[[], bool] = lambda: False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.index = index
        self.scheduler = scheduler
        self.initial_files = initial_files
        self.max_bytes = max_bytes
        self.head_blocks = head_blocks
        self.confirm = confirm
        self.max_runs = max_runs
        self._paused = paused
        self._clock = clock
        self._runs: list[_Run] = []
        self._tick = 0  # reads observed
        self.requested = 0  # blocks handed to the scheduler

    def observe(self, digests: Sequence[str], hit: bool) -> None:
        """An access-log subscriber: readers read ``digests``."""
        if self._paused():
            return
        for digest in digests:
            self._tick += 1
            for snapshot, positions in self.index.lookup(digest):
                self._read(snapshot, positions)

    @property
    def runs(self) -> int:
        """Runs being tracked (started or candidates)."""
        return len(self._runs)

    def _read(self, snapshot: IndexedSnapshot, positions: list[int]) -> None:
        now = self._clock()
        for run in self._runs:
            if run.snapshot is not snapshot:
                continue
            for pos in positions:
                if run.last - SLACK <= pos <= max(run.last, run.ahead_to) + 1:
                    if pos > run.last:
                        self._advance(run, pos)
                    run.touched, run.tick = now, self._tick
                    return
        self._runs.append(
            _Run(snapshot, positions[0], ahead_to=positions[0], touched=now, tick=self._tick)
        )
        if len(self._runs) > self.max_runs:
            self._runs.remove(min(self._runs, key=lambda r: r.touched))

    def _advance(self, run: _Run, pos: int) -> None:
        if pos == run.last + 1:
            run.steps = run.steps + 1 if self._tick - run.tick <= GAP else 1
        run.last = pos
        if run.window == 0:
            if run.steps < self.confirm:
                run.ahead_to = max(run.ahead_to, pos)
                return
            files = run.snapshot.files
            stop = min(len(files), max(run.ahead_to, pos) + 1 + self.initial_files)
            run.window = sum(self._head_bytes(files[i]) for i in range(pos + 1, stop)) or 1
        elif pos >= run.marker:
            run.window = min(run.window * 2, self.max_bytes)
        else:
            return
        self._issue(run, max(run.ahead_to, pos) + 1)

    def _issue(self, run: _Run, start: int) -> None:
        files = run.snapshot.files
        blocks: list[tuple[str, int]] = []
        total = 0
        end = start
        # within the scheduler's prefetch budget: a file it would drop must stay ahead
        # of the run, to be asked for at the next marker
        want = min(run.window, self.scheduler.prefetch_room)
        while end < len(files) and total < want:
            head = files[end][: self.head_blocks]
            if total + sum(size for _, size in head) > want and blocks:
                break
            blocks += head
            total += sum(size for _, size in head)
            end += 1
        if not blocks:
            return
        run.ahead_to = end - 1
        run.marker = start
        self.requested += self.scheduler.prefetch(blocks, Priority.READAHEAD)

    def _head_bytes(self, blocks: list[tuple[str, int]]) -> int:
        return sum(size for _, size in blocks[: self.head_blocks])
