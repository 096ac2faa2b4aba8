"""One reader's planned reads and the cursor that follows them: :class:`HintStream`.

:class:`HintStream` is one reader's stream: its plans
(:class:`~spoke.cache.hintplan.HintPlan`), appended in order, and the cursor that follows
the reads. Positions are absolute inside the stream; the stream shows them
relative to its *base*, which moves forward when the read prefix is dropped (a plan is let
go once every position in it is before the base). The rules (tolerance, repeated reports,
skipped reads) are :mod:`spoke.cache.hinted`'s.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Sequence

from spoke.cache.hintplan import HintPlan

NEVER = 1 << 62  # "next use" of a block no stream reads again
DEFAULT_TOLERANCE = 32  # hinted positions a read may arrive out of order


class HintStream:
    """One reader's planned reads: block digests in order, and how far they have been read.

    Args:
        name: the stream's name (e.g. ``fit-1a2b3c.rank0``).
        tolerance: how far (in positions) reads may be out of order; a read more than this
            ahead of the oldest unread position moves it forward, so a skipped or
            unreported read does not hold the cursor forever.

    Attributes:
        cursor: every position before it has been read (or skipped).
        frontier: one past the farthest position read.
        rate: positions per clock tick (``1 / streams``); with :attr:`t0` (clock) and
            :attr:`p0` (position of the last prediction) it says :meth:`when` a position
            is read.

    Positions (:attr:`cursor`, :attr:`frontier`, :attr:`p0`, what :meth:`next_use`
    returns) count from the first position still kept.

    Its twenty-odd methods are small views of one cursor over one list of plans (where a
    position is, what it reads, when it is predicted, how the read prefix is let go); the
    plans' own layout is :class:`~spoke.cache.hintplan.HintPlan`'s.
    """

    def __init__(self, name: str, tolerance: int = DEFAULT_TOLERANCE) -> None:
        if tolerance < 1:
            raise ValueError("tolerance must be >= 1")
        self.name = name
        self.tolerance = tolerance
        self.t0 = 0
        self.p0 = 0
        self.rate = 1.0
        self._plans: list[HintPlan] = []
        self._starts: list[int] = []  # absolute position of each plan's first
        self._base = 0  # absolute position of relative position 0
        self._end = 0  # absolute position after the last
        self.cursor = 0
        self.frontier = 0
        self._ahead: set[int] = set()  # positions >= cursor already read (out of order)
        self._last: dict[str, tuple[int, int]] = {}  # digest -> (last position read, reads then)
        self._reads = 0
        self._window: Counter[str] = Counter()  # digests in [cursor, head + tolerance)
        self._window_lo = 0  # absolute bounds of the window
        self._window_hi = 0

    def __len__(self) -> int:
        return self._end - self._base

    @property
    def head(self) -> int:
        """The next position the reader is expected at (past the farthest read)."""
        return max(self.frontier, self.cursor)

    @property
    def remaining(self) -> int:
        """Positions not yet read or skipped."""
        return len(self) - self.cursor

    @property
    def plans(self) -> int:
        """Plans (posted segments) still kept."""
        return len(self._plans)

    def memory_bytes(self) -> int:
        """About how many bytes the stream's plans hold."""
        return sum(plan.memory_bytes() for plan in self._plans)

    def distinct_blocks(self) -> int:
        """Distinct digests summed over the kept plans (a digest in two counts twice)."""
        return sum(len(plan.keys) for plan in self._plans)

    def digests(self) -> set[str]:
        """Every digest the kept plans mention (read positions included)."""
        return {key for plan in self._plans for key in plan.keys}

    def mentions(self, digest: str) -> bool:
        """True when a kept plan reads ``digest`` somewhere (read positions included)."""
        return any(plan.code(digest) >= 0 for plan in self._plans)

    def when(self, pos: int) -> float:
        """The clock time at which position ``pos`` is expected to be read."""
        return self.t0 + (pos - self.p0) / self.rate

    def predicted_head(self, now: int) -> float:
        """Where :attr:`head` should be at clock time ``now``."""
        return self.p0 + (now - self.t0) * self.rate

    def digest_at(self, pos: int) -> str:
        """The digest planned at position ``pos`` (``0 <= pos < len(self)``)."""
        plan, local = self._locate(pos + self._base)
        return plan.keys[plan.codes[local]]

    def block_at(self, pos: int) -> tuple[str, int]:
        """The digest planned at position ``pos`` and its block size, bytes (0: unknown)."""
        plan, local = self._locate(pos + self._base)
        code = plan.codes[local]
        return plan.keys[code], plan.sizes[code]

    def _locate(self, absolute: int) -> tuple[HintPlan, int]:
        i = bisect_right(self._starts, absolute) - 1
        return self._plans[i], absolute - self._starts[i]

    def extend(self, digests: Sequence[str] | HintPlan) -> None:
        """Append planned reads (a :class:`HintPlan`, or digests to make one of). Drops the
        read prefix first once it is half the stream (predictions stay put: :attr:`p0`
        moves with the positions)."""
        if self.cursor and self.cursor * 2 >= len(self):
            self._rebase(self.cursor)
        plan = digests if isinstance(digests, HintPlan) else HintPlan.of(digests)
        if len(plan):
            self._plans.append(plan)
            self._starts.append(self._end)
            self._end += len(plan)
        self._slide()

    def next_use(self, digest: str) -> int:
        """Position of ``digest``'s next unread planned read, or :data:`NEVER`."""
        # the hot path of every read and every eviction choice: HintPlan.code inlined
        base, ahead = self._base, self._ahead
        first = self.cursor + base
        for start, plan in zip(self._starts, self._plans, strict=True):
            if start + len(plan.codes) <= first:
                continue
            keys = plan.keys
            code = bisect_left(keys, digest)
            if code == len(keys) or keys[code] != digest:
                continue
            order, hi = plan.order, plan.starts[code + 1]
            i = bisect_left(order, first - start, plan.starts[code], hi)
            while i < hi:
                pos = order[i] + start - base
                if pos not in ahead:
                    return pos
                i += 1
        return NEVER

    def distance(self, digest: str) -> int | None:
        """How far ahead of :attr:`head` a read of ``digest`` now would count, or None
        when it would not count (not planned within ``tolerance``, or a repeated report).

        A repeated report (several FUSE reads of one block, a hit reported again) is
        recognised because far fewer reads happened since the block's last counted read
        than the plan puts between the two.
        """
        if digest not in self._window:
            return None  # no unread position of it before head + tolerance
        pos = self.next_use(digest)
        if pos >= self.head + self.tolerance:
            return None  # not planned here (NEVER included)
        last = self._last.get(digest)
        if last is not None and self._reads - last[1] < (pos - last[0]) // 2:
            return None
        return pos - self.head

    def observe(self, digest: str) -> list[str] | None:
        """Count a read of ``digest`` if :meth:`distance` allows it.

        Returns:
            The digests whose next use changed (the one read, and any skipped over), or
            None when the read did not count.
        """
        if self.distance(digest) is None:
            return None
        pos = self.next_use(digest)
        self._reads += 1
        self._last[digest] = (pos, self._reads)
        self._ahead.add(pos)
        self.frontier = max(self.frontier, pos + 1)
        changed = [digest]
        while True:
            if self.cursor in self._ahead:
                self._ahead.remove(self.cursor)
                self.cursor += 1
            elif self.frontier - self.cursor > self.tolerance:  # a read never reported
                skipped = self.digest_at(self.cursor)
                self._last[skipped] = (self.cursor, self._reads)
                self.cursor += 1
                changed.append(skipped)
            else:
                self._slide()
                return changed

    def upcoming(self, count: int) -> list[tuple[int, str]]:
        """The next ``count`` unread ``(position, digest)`` pairs from :attr:`head` on."""
        return [(pos, digest) for pos, digest, _ in self.upcoming_blocks(count)]

    def upcoming_blocks(self, count: int) -> list[tuple[int, str, int]]:
        """As :meth:`upcoming`, with each block's planned size (bytes; 0: unknown)."""
        out: list[tuple[int, str, int]] = []
        pos = self.head
        while pos < len(self) and len(out) < count:
            if pos not in self._ahead:
                out.append((pos, *self.block_at(pos)))
            pos += 1
        return out

    def _slide(self) -> None:
        """Moves the window of digests to ``[cursor, head + tolerance)``."""
        lo = self.cursor + self._base
        hi = min(self._end, self.head + self._base + self.tolerance)
        if lo >= self._window_hi or hi <= self._window_lo:  # disjoint: start afresh
            self._window.clear()
            self._window_lo = self._window_hi = lo
        while self._window_lo < lo:
            self._drop(self._window_lo)
            self._window_lo += 1
        while self._window_hi < hi:
            self._window[self.digest_at(self._window_hi - self._base)] += 1
            self._window_hi += 1
        while self._window_hi > hi:
            self._window_hi -= 1
            self._drop(self._window_hi)

    def _drop(self, absolute: int) -> None:
        digest = self.digest_at(absolute - self._base)
        left = self._window[digest] - 1
        if left > 0:
            self._window[digest] = left
        else:
            del self._window[digest]

    def _rebase(self, offset: int) -> None:
        self._base += offset
        while self._plans and self._starts[0] + len(self._plans[0]) <= self._base:
            self._plans.pop(0)
            self._starts.pop(0)
        self.p0 -= offset
        self.cursor -= offset
        self.frontier -= offset
        self._ahead = {p - offset for p in self._ahead}
        self._last = {d: (p - offset, n) for d, (p, n) in self._last.items()}

    def check_invariants(self) -> None:
        """Cursor, frontier, window and out-of-order reads are consistent (used by tests)."""
        assert all(p >= self.cursor for p in self._ahead), "read position behind cursor"
        assert self.cursor <= self.head <= len(self), "cursor past the hint"
        lo, hi = self.cursor, min(len(self), self.head + self.tolerance)
        want = Counter(self.digest_at(p) for p in range(lo, hi))
        assert self._window == want, "window out of step with the cursor"
