"""Turns at a scarce step, shared fairly between tokens.

A step that only ``slots`` calls may run at once (building a ``ListDirectory`` page) needs
more than a semaphore: :class:`asyncio.Semaphore` serves its waiters first come, first
served, so tokens that keep many calls queued keep every other token's call behind all
of theirs (issue 39's sixth probe: a light tenant got 1 of 6 listings while colluding
tokens kept large listings building). :class:`FairTurns` keeps one queue per token and
hands each freed slot to the next token in turn (round robin, as in deficit round robin
with equal quanta: Shreedhar & Varghese, "Efficient Fair Queuing using Deficit Round
Robin", SIGCOMM 1995), so a token with one call waits for at most one turn of each
other token with calls waiting, however many those queue.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict, deque
from collections.abc import AsyncIterator


class FairTurns:
    """At most ``slots`` holders at once; waiters are served one token at a time, in turn.

    Single event loop only (no locks): every method runs on the loop that awaits it.

    Args:
        slots: holders at once (≥ 1).

    Raises:
        ValueError: ``slots`` < 1.
    """

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"slots must be at least 1, not {slots}")
        self.slots = slots
        self._free = slots
        self._queues: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()

    @property
    def waiting(self) -> int:
        """Calls waiting for a turn now (those cancelled meanwhile excluded)."""
        return sum(not f.done() for q in self._queues.values() for f in q)

    @property
    def held(self) -> int:
        """Slots held now."""
        return self.slots - self._free

    @contextlib.asynccontextmanager
    async def turn(self, token: str) -> AsyncIterator[None]:
        """Hold one slot for ``token`` while the block runs, waiting for it in ``token``'s
        queue when none is free (a cancelled wait gives up its place, or the slot it had
        just been given)."""
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
        try:
            yield
        finally:
            self._pass_on()

    def _pass_on(self) -> None:
        """A slot is freed: to the first waiter of the next token in turn (that token
        then goes to the back of the round), or back to the free slots."""
        while self._queues:
            token, queue = next(iter(self._queues.items()))
            waiter = queue.popleft()
            if queue:
                self._queues.move_to_end(token)
            else:
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
