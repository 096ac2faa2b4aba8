"""Turns at a scarce step, shared fairly between tokens.

A step that only ``slots`` calls may run at once (building a ``ListDirectory`` or
``GetManifest`` page) needs more than a semaphore: :class:`asyncio.Semaphore` serves its
waiters first come, first served, so tokens that keep many calls queued keep every other
token's call behind all of theirs (issue 39's sixth probe: a light tenant got 1 of 6
listings while colluding tokens kept large listings building). :class:`FairTurns` keeps
one queue per token and hands each freed slot to the waiting token that has held slots
for the least time lately (each token's seconds of turns, halved every
:data:`HALF_LIFE_S`): the rule of the Linux scheduler's CFS, which runs the task with the
least virtual runtime (``Documentation/scheduler/sched-design-CFS.rst``). A tenant whose
pages are small is served before tokens that keep building large ones, and tokens that
all build large pages share the slots by time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Callable

HALF_LIFE_S = 10.0
"""A token's past use of the slots counts half after this many seconds."""

TRACKED = 4096
"""Most tokens whose use is remembered; beyond, the least used are forgotten (a
forgotten token counts as one that used nothing)."""


class FairTurns:
    """At most ``slots`` holders at once; a freed slot goes to the first waiter of the
    token that used the slots least lately (ties: the token that queued first).

    Single event loop only (no locks): every method runs on the loop that awaits it.

    Args:
        slots: holders at once (≥ 1).
        clock: monotonic seconds (tests pass their own).

    Raises:
        ValueError: ``slots`` < 1.
    """

    def __init__(self, slots: int, clock: Callable[[], float] = time.monotonic) -> None:
        if slots < 1:
            raise ValueError(f"slots must be at least 1, not {slots}")
        self.slots = slots
        self._clock = clock
        self._free = slots
        self._queues: dict[str, deque[asyncio.Future[None]]] = {}  # in the order they queued
        self._used: dict[str, tuple[float, float]] = {}  # token: (seconds, as of when)

    @property
    def waiting(self) -> int:
        """Calls waiting for a turn now (those cancelled meanwhile excluded)."""
        return sum(not f.done() for q in self._queues.values() for f in q)

    @property
    def held(self) -> int:
        """Slots held now."""
        return self.slots - self._free

    def used(self, token: str) -> float:
        """Seconds ``token`` held slots lately (decayed by :data:`HALF_LIFE_S`)."""
        seconds, at = self._used.get(token, (0.0, 0.0))
        return seconds * 0.5 ** ((self._clock() - at) / HALF_LIFE_S) if seconds else 0.0

    @contextlib.asynccontextmanager
    async def turn(self, token: str) -> AsyncIterator[None]:
        """Hold one slot for ``token`` while the block runs, waiting for it in ``token``'s
        queue when none is free (a cancelled wait gives up its place, or the slot it had
        just been given); the time held counts against ``token``'s next turns."""
        if self._free > 0 and not self._queues:
            self._free -= 1
        else:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._queues.setdefault(token, deque()).append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._pass_on()  # given the slot as it was cancelled: the next one's
                else:
                    waiter.cancel()
                    self._forget(token, waiter)
                raise
        started = self._clock()
        try:
            yield
        finally:
            self._charge(token, self._clock() - started)
            self._pass_on()

    def _charge(self, token: str, seconds: float) -> None:
        self._used[token] = (self.used(token) + seconds, self._clock())
        if len(self._used) > TRACKED:
            for least in sorted(self._used, key=self.used)[: len(self._used) - TRACKED]:
                del self._used[least]

    def _pass_on(self) -> None:
        """A slot is freed: to the first live waiter of the least-used waiting token, or
        back to the free slots."""
        while self._queues:
            token = min(self._queues, key=self.used)  # min keeps the first of equals
            queue = self._queues[token]
            waiter = queue.popleft()
            if not queue:
                del self._queues[token]
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1

    def _forget(self, token: str, waiter: asyncio.Future[None]) -> None:
        queue = self._queues.get(token)
        if queue is None:
            return
        with contextlib.suppress(ValueError):
            queue.remove(waiter)
        if not queue:
            del self._queues[token]
