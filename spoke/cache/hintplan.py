"""One posted segment of planned reads, held compactly: :class:`HintPlan`, built by
:class:`PlanBuilder`.

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
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Iterable


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
