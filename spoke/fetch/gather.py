"""Demand misses gathering onto one stream (:class:`DemandGather`): while a demand stream
waits for its first block, new misses wait, at most :data:`DEMAND_GATHER_S`, and leave
together, so many readers' small misses make few streams. The scheduler
(:mod:`spoke.fetch.scheduler`) asks it before each demand batch. Loop-only state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from spoke.fetch.pacer import Pacer

DEMAND_GATHER_S = 0.002
"""Longest a demand miss waits to share a stream with others while a demand stream waits
for its first block (:attr:`spoke.fetch.pacer.Pacer.gathering`); a lone miss leaves at once."""


class DemandGather:
    """Whether queued demand waits now, and the timer that ends its wait.

    Args:
        pacer: whose demand streams are waited on (:attr:`~spoke.fetch.pacer.Pacer.gathering`).
        seconds: longest a miss is held (0: never).
        ran_out: called when the gather time runs out (the scheduler pumps again).
    """

    def __init__(self, pacer: Pacer, seconds: float, ran_out: Callable[[], None]) -> None:
        self.pacer = pacer
        self.seconds = seconds
        self._ran_out = ran_out
        self._timer: asyncio.TimerHandle | None = None  # ends the gathering of demand
        self._expired = False  # the gather time ran out: queued demand leaves now

    def holding(self) -> bool:
        """True while queued demand waits to share a stream: a demand stream waits for its
        first block and the gather time has not run out (its timer is set here)."""
        if self._expired or self.seconds <= 0 or not self.pacer.gathering:
            return False
        if self._timer is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.seconds, self._expire)
        return True

    def _expire(self) -> None:
        self._timer = None
        self._expired = True
        self._ran_out()

    def end(self) -> None:
        """A demand batch left (or the scheduler closes): the next misses gather afresh."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._expired = False
