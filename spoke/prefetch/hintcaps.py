"""What one hint post may hold: the caps it must stay within, a scoped admin token's
share of the totals (:class:`HintShare`), and the plan builder that keeps to them
(:class:`CappedBuilder`) — :class:`spoke.prefetch.hints.HintService`'s accounting, apart
from its streams and prefetching. Imports only the cache's plan types and the errors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from spoke.cache.hinted import HintStream
from spoke.cache.hintplan import PlanBuilder
from spoke.errors import OverLimit


@dataclass(frozen=True)
class HintShare:
    """Who posts, when it is a scoped admin token: the streams it ``owns`` may hold at most
    1/``share`` of each total of :class:`~spoke.prefetch.hints.HintService` (planned reads,
    :data:`~spoke.prefetch.hints.MAX_TOTAL_POSITIONS`; distinct blocks,
    :data:`~spoke.prefetch.hints.MAX_TOTAL_BLOCKS`), and its post may not take the last
    1/``reserve`` of either (kept for the node-wide token, which posts with no share). What
    a stream holds is counted from the installed streams at each post, so a stream that
    ends, expires, is replaced or deleted frees its share at once.

    Attributes:
        name: the token's name, for refusals.
        owns: whether a stream whose plan reads ``source`` (``DATASET@VERSION, ...``, as
            :attr:`~spoke.prefetch.hints.HintStatus.source`) counts as this token's.
        share: the token's share is 1/``share`` of each total.
        reserve: the last 1/``reserve`` of each total is the node-wide token's.
    """

    name: str
    owns: Callable[[str], bool]
    share: int
    reserve: int


@dataclass(frozen=True)
class Cap:
    """One cap a post must stay within: ``name`` and ``value`` as the 400 says them,
    ``held`` what is counted against it already, ``whose`` what it counts (for the message)
    and ``note`` what it is, if more than a cap."""

    name: str
    value: int
    held: int
    whose: str
    note: str = ""

    @property
    def room(self) -> int:
        """How much more fits (at least 0)."""
        return max(0, self.value - self.held)


def held(streams: Iterable[HintStream], plus: tuple[int, int] = (0, 0)) -> tuple[int, int]:
    """Planned reads and distinct blocks (summed per stream) ``streams`` hold, plus ``plus``."""
    positions, blocks = plus
    for s in streams:
        positions += len(s)
        blocks += s.distinct_blocks()
    return positions, blocks


def shared_caps(share: HintShare, what: str, cap: int, mine: int, total: int) -> list[Cap]:
    """A scoped token's two caps on one total ``cap``: its share (``mine`` held on its
    datasets) and the total less the operator's reserve (``total`` held by all)."""
    part, reserve = max(1, cap // share.share), max(1, cap // share.reserve)
    return [
        Cap(
            f"tenant_{what}",
            part,
            mine,
            f"the hint streams on the datasets of admin token {share.name!r} together",
            f" for a scoped token (1/{share.share} of {cap:,})",
        ),
        Cap(
            f"reserve_{what}",
            cap - reserve,
            total,
            "the hint streams together",
            f" while a scoped token posts (the last {reserve:,} of {cap:,} are kept for "
            "the node's admin token)",
        ),
    ]


class CappedBuilder(PlanBuilder):
    """A :class:`PlanBuilder` whose limits are the service's caps less what is held."""

    def __init__(self, positions: Cap, blocks: Cap) -> None:
        super().__init__(positions.room, blocks.room, (positions.name, blocks.name))
        self._positions, self._blocks = positions, blocks

    def check(self, positions: int, blocks: int) -> None:
        """Refuses a built plan of this many positions and distinct blocks past a cap.

        Raises:
            OverLimit: naming the cap and its value.
        """
        if positions > self._positions.room:
            self._too_many(positions)
        if blocks > self._blocks.room:
            self._too_many_blocks(blocks)

    def _too_many(self, positions: int) -> None:
        self._refuse(self._positions, positions, "planned reads")

    def _too_many_blocks(self, blocks: int) -> None:
        self._refuse(self._blocks, blocks, "distinct blocks")

    @staticmethod
    def _refuse(cap: Cap, wanted: int, what: str) -> None:
        raise OverLimit(
            f"{cap.whose} would hold {cap.held + wanted:,} {what} or more; "
            f"at most {cap.value:,} are kept{cap.note} ({cap.name})",
            cap.name,
            cap.value,
        )
