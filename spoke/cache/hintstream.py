"""One reader's planned reads, held compactly: :class:`HintPlan` and :class:`HintStream`.

A hint can plan millions of reads (a rank's shard of an epoch, epochs appended), so a
plan keeps no Python object per position. :class:`HintPlan` is one posted segment:

- ``keys``: the distinct digests, sorted (a digest's *code* is its index; found by
  bisection, no dict);
- ``codes``: the code of every position (``array('i')``, 4 bytes a position);
- ``order`` and ``starts``: the positions grouped by code, ascending (a counting sort;
  4 bytes a position and 4 a digest), so a digest's next planned read at or after a
  cursor is two bisections;
- ``sizes``: each digest's block size (8 bytes a digest).

That is 8 bytes a position plus about 100 bytes a distinct digest (its string and slots),
against about 125 bytes a position as Python lists and dicts. A plan is built once, in a
worker thread when it comes from the admin API (:class:`PlanBuilder`), and never changes.

:class:`HintStream` is one reader's stream: its plans, appended in order, and the cursor
that follows the reads. Positions are absolute inside the stream; the stream shows them
relative to its *base*, which moves forward when the read prefix is dropped (a plan is let
go once every position in it is before the base). The rules (tolerance, repeated reports,
skipped reads) are :mod:`spoke.cache.hinted`'s.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Iterable, Sequence

NEVER = 1 << 62  # "next use" of a block no stream reads again
DEFAULT_TOLERANCE = 32  # hinted positions a read may arrive out of order


class PlanLimit(ValueError):
    """A plan would pass a limit; ``limit`` names it and ``value`` is its value."""

    def __init__(self, message: str, limit: str, value: int) -> None:
        super().__init__(message)
        self.limit = limit
        self.value = value


class HintPlan:
    """An immutable segment of planned reads (see the module docstring).

    Build one with :class:`PlanBuilder` or :meth:`of`.

    Attributes:
        keys: Distinct digests, sorted.
        codes: Per position, the index of its digest in ``keys``.
        order: Positions grouped by code (code 0's first), ascending within a code.
        starts: ``order[starts[c]:starts[c + 1]]`` are code ``c``'s positions.
        sizes: Per code, the block's size in bytes (0 when not given).
    """

    __slots__ = ("codes", "keys", "order", "sizes", "starts")

    def __init__(
        self,
        keys: list[str],
        codes: array[int],
        order: array[int],
        starts: array[int],
        sizes: array[int],
    ) -> None:
        self.keys, self.codes, self.order, self.starts, self.sizes = (
            keys,
            codes,
            order,
            starts,
            sizes,
        )

    @classmethod
    def of(cls, digests: Iterable[str], sizes: Iterable[int] | None = None) -> HintPlan:
        """A plan of ``digests`` in order (with their block ``sizes``, bytes)."""
        builder = PlanBuilder()
        if sizes is None:
            for digest in digests:
                builder.add(builder.code(digest, 0))
        else:
            for digest, size in zip(digests, sizes, strict=True):
                builder.add(builder.code(digest, size))
        return builder.build()

    def __len__(self) -> int:
        return len(self.codes)

    @property
    def smallest(self) -> int:
        """The smallest block size given, bytes (``1 << 62`` when none was)."""
        given = [s for s in self.sizes if s > 0]
        return min(given) if given else 1 << 62

    def code(self, digest: str) -> int:
        """``digest``'s code, or -1 when the plan never reads it."""
        i = bisect_left(self.keys, digest)
        return i if i < len(self.keys) and self.keys[i] == digest else -1

    def memory_bytes(self) -> int:
        """About how many bytes the plan holds (arrays plus the digest strings)."""
        arrays = (self.codes, self.order, self.starts, self.sizes)
        return sum(a.itemsize * len(a) for a in arrays) + 90 * len(self.keys)


class PlanBuilder:
    """Builds a :class:`HintPlan` position by position, within limits.

    Args:
        most_positions: Refuse (:class:`PlanLimit`, ``limit``) more positions than this.
        most_blocks: Refuse more distinct digests than this.
        limit_names: The names the two limits go by in errors.
    """

    def __init__(
        self,
        most_positions: int = 2**31 - 1,
        most_blocks: int = 2**31 - 1,
        limit_names: tuple[str, str] = ("positions", "blocks"),
    ) -> None:
        self._codes: dict[str, int] = {}
        self._keys: list[str] = []
        self._sizes = array("q")
        self.positions = array("i")
        self._most_positions = most_positions
        self._most_blocks = most_blocks
        self._names = limit_names

    def code(self, digest: str, size: int) -> int:
        """A provisional code for ``digest`` (its block ``size``, bytes), new or known.

        Raises:
            PlanLimit: One distinct digest too many.
        """
        code = self._codes.get(digest)
        if code is None:
            code = len(self._keys)
            if code >= self._most_blocks:
                self._too_many_blocks(code + 1)
            self._codes[digest] = code
            self._keys.append(digest)
            self._sizes.append(size)
        return code

    def add(self, code: int) -> None:
        """Appends one position reading provisional ``code``.

        Raises:
            PlanLimit: The plan would pass its most positions.
        """
        if len(self.positions) >= self._most_positions:
            self._too_many(len(self.positions) + 1)
        self.positions.append(code)

    def extend(self, codes: array[int]) -> None:
        """Appends positions reading provisional ``codes``.

        Raises:
            PlanLimit: The plan would pass its most positions.
        """
        if len(self.positions) + len(codes) > self._most_positions:
            self._too_many(len(self.positions) + len(codes))
        self.positions.extend(codes)

    def _too_many_blocks(self, blocks: int) -> None:
        """Raises the error for a plan of ``blocks`` distinct digests, past the limit."""
        raise PlanLimit(
            f"the hint would plan more than {self._most_blocks:,} distinct blocks",
            self._names[1],
            self._most_blocks,
        )

    def _too_many(self, positions: int) -> None:
        """Raises the error for a plan of ``positions`` reads, past the limit."""
        raise PlanLimit(
            f"the hint would plan {positions:,} reads or more; "
            f"at most {self._most_positions:,} are kept",
            self._names[0],
            self._most_positions,
        )

    def build(self) -> HintPlan:
        """The plan: keys sorted, codes renumbered, positions grouped by code."""
        count = len(self._keys)
        by_key = sorted(range(count), key=self._keys.__getitem__)
        rank = array("i", bytes(4 * count))
        for new, old in enumerate(by_key):
            rank[old] = new
        keys = [self._keys[old] for old in by_key]
        sizes = array("q", (self._sizes[old] for old in by_key))
        self._codes.clear()
        self._keys.clear()
        codes = array("i", map(rank.__getitem__, self.positions))
        self.positions = array("i")
        starts = array("i", bytes(4 * (count + 1)))
        for code in codes:  # counting sort: how many positions each code has
            starts[code + 1] += 1
        for c in range(count):
            starts[c + 1] += starts[c]
        fill = array("i", starts[:count])
        order = array("i", bytes(4 * len(codes)))
        for pos, code in enumerate(codes):
            order[fill[code]] = pos
            fill[code] += 1
        return HintPlan(keys, codes, order, starts, sizes)


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
