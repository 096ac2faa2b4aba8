"""How many ``GetManifest``, ``Watch`` and unary calls the hub keeps open, per token and in all.

A response stream its client does not read holds what the hub has prepared for it: a
stalled ``GetManifest`` keeps a serialized page of the catalog and the page read ahead
(about 215 KiB for 256 entries of 250-byte paths), a ``Watch`` about 26 KiB of gRPC
state. ``ReadBlocks`` streams are bounded by their bytes (:mod:`hub.limits.budget`); these two by
their number (:class:`StreamSlots`):

- ``GetManifest``: at most :data:`MANIFEST_STREAMS` at once (256: about 55 MiB stalled),
  one token at most an eighth of them. A manifest is read in well under a second, so a
  stream without a slot *waits* for one, first come first served, up to
  :data:`~hub.limits.budget.WAIT_S`, then is refused; the spokes of a region asking for a new
  snapshot's manifest at once queue for seconds instead of failing. Waiting streams hold
  no page; one token may have at most four times its slots waiting, beyond which it is
  refused at once.
- ``Watch``: at most :data:`WATCH_STREAMS` at once (8,192: about 210 MiB), one token at
  most an eighth. A spoke holds one for as long as it runs, so a stream without a slot is
  refused at once (it retries with backoff).

- Unary calls: their reply waits at the hub until the client takes it, after the handler
  has returned, so a call holds a slot from its start until gRPC reports it done: at most
  :data:`LISTING_CALLS` ``ListDirectory`` calls and :data:`UNARY_CALLS` others, a token at
  most an eighth, refused at once beyond (a client that had 128 listings of 10,000
  entries unread took the hub past 1 GiB).

A unary reply (or a ``GetManifest`` message) its client has not taken within
:data:`REPLY_S` (a client that never opens its HTTP/2 window) stops counting in the hub's
total and counts only in its token's share
until the call ends (:meth:`StreamSlots.unhold`): twelve tokens pinning every
``ListDirectory`` slot that way locked the others out for as long as they stayed; now for
30 s (the second re-probe's ``listpin.py 12 60``: refused until 30 s, then 32 of 32 served).

The last eighth of each kind's slots is kept for tokens holding fewer than 16 of that
kind, or a quarter of their share where that is fewer (4 ``ListDirectory`` calls,
:func:`hub.limits.slots.slot_free`): eight tokens at their eighth each, re-opening calls
as they end, cannot lock the others out.

Stalled clients of one token can hold an eighth of each kind, so about 60 MiB beside its
192 MiB of the read budget; of every token together, the read budget's 384 MiB, 55 MiB of
manifests (a page ends past :data:`hub.serve.wire.MANIFEST_MESSAGE_BYTES`), 210 MiB of
watches and up to 100 + 105 MiB of unary replies — twice that for the kinds whose unread
replies may leave the total, which at most as many as the kind's slots may do at once —
over a serving hub's 143 MiB: the whole passes the 1 GiB limit only when every kind is full
at once from many colluding tokens (issue 39's fifth probe, 24 tokens pinning listings of
4 KB paths in waves: 316 MiB). Refusals are
:class:`~hub.errors.QuotaExceeded` (``RESOURCE_EXHAUSTED``, ``limit="streams"``), counted
and audited like the budget's.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator

from hub.errors import QuotaExceeded
from hub.limits.slots import reserved_below, reserved_slots, slot_free

MANIFEST_STREAMS = 256
"""Default most ``GetManifest`` streams open at once (``--max-manifest-streams``)."""

WATCH_STREAMS = 8192
"""Default most ``Watch`` streams open at once (``--max-watch-streams``): a spoke holds one."""

LISTING_CALLS = 128
"""Most ``ListDirectory`` calls open at once, their replies sent or not: a page ends past
:data:`hub.serve.service.LISTING_REPLY_BYTES` (256 KiB) whatever its entries, about 0.8 MiB
held with gRPC's copies until the client reads it (measured: 12.3 MiB for an uncut 4.1 MB
reply), so about 100 MiB, and as much again out of the total (:meth:`StreamSlots.unhold`)."""

UNARY_CALLS = 4096
"""Most other unary calls open at once (``ResolveRef``, ``ListVersions``,
``ListDatasets``, ``IssueGrant``, ``GrantKeys``): about 26 KiB each unread, 105 MiB."""

REPLY_S = 30.0
"""Longest a unary reply its client has not taken counts against the hub's total of its
kind (:meth:`StreamSlots.unhold`); it counts against its token's own share until the call
ends, so a token's unread replies stay bounded by its share."""

PENALTY_S = 300.0
"""For this long after one of its replies went unread for :data:`REPLY_S`, a token may hold
only :func:`hub.limits.slots.reserved_below` slots of that kind (issue 39's fourth probe: twelve
tokens closed their pinned calls just after the 30 s and pinned every slot again)."""

TOKEN_SHARE = 8
"""One token may hold at most 1/``TOKEN_SHARE`` of a kind's slots."""

WAITING_PER_SLOT = 4
"""A token may have at most this many streams waiting per slot it may hold."""


class StreamSlots:
    """Open streams of one kind, per principal and in total; used from one event loop.

    Args:
        kind: The RPC's name, for messages (``GetManifest``).
        flag: What sets ``total`` (a flag, or the constant), for messages.
        total: Most streams open at once.
        wait_s: Longest a stream waits for a slot, seconds (0: refused at once).
    """

    def __init__(self, kind: str, flag: str, total: int, wait_s: float = 0.0) -> None:
        if total < TOKEN_SHARE or wait_s < 0:
            raise ValueError(f"{flag} must be at least {TOKEN_SHARE}, got {total}")
        self.kind = kind
        self.flag = flag
        self.total = total
        self.per_token = total // TOKEN_SHARE
        self.wait_s = wait_s
        self.open = 0
        self._open: collections.Counter[str] = collections.Counter()
        self._waiting: collections.Counter[str] = collections.Counter()
        self.unheld = 0  # slots counted in their tokens' shares only (unhold)
        self._freed = asyncio.Event()  # set (and replaced) whenever a slot is released
        self._penalised: dict[str, float] = {}  # token -> loop time its penalty ends

    def open_by(self, name: str) -> int:
        """Streams principal ``name`` has open."""
        return self._open[name]

    def _free_for(self, name: str) -> bool:
        per_token = self.per_token
        until = self._penalised.get(name)
        if until is not None:
            if asyncio.get_running_loop().time() < until:
                per_token = reserved_below(self.per_token)
            else:
                del self._penalised[name]
        return slot_free(self.total, self.open, self._open[name], per_token)

    @contextlib.asynccontextmanager
    async def slot(self, name: str) -> AsyncIterator[None]:
        """Holds one of the slots for principal ``name`` for the ``async with`` block,
        waiting up to :attr:`wait_s` for one.

        Raises:
            QuotaExceeded: no slot within the wait, or too many of ``name``'s waiting.
        """
        await self.acquire(name)
        try:
            yield
        finally:
            self.release(name)

    async def acquire(self, name: str) -> None:
        """Take one of the slots for principal ``name``, waiting up to :attr:`wait_s`;
        :meth:`release` gives it back (for a unary call, once its reply has left).

        Raises:
            QuotaExceeded: no slot within the wait, or too many of ``name``'s waiting.
        """
        if not self._free_for(name):
            await self._wait(name)
        self.open += 1
        self._open[name] += 1

    def unhold(self, name: str) -> bool:
        """Stop counting one of ``name``'s slots in the hub's total while it stays counted
        in ``name``'s own share: for a reply its client has not taken within
        :data:`REPLY_S` (a client that never opens its window would otherwise hold a slot
        of everyone's until it goes away). :meth:`release` with ``held=False`` ends it.

        At most :attr:`total` slots are out of the total at once (a second, equal pool): so
        what unread replies hold stays bounded over every token, however many collude
        (issue 39's fifth probe: 24 tokens in waves of 8 took the hub to 3.7 GiB when
        every slot that left the total made room for another). Beyond it the slot stays
        in the total (its token is penalised all the same).

        Returns:
            Whether the slot left the total.
        """
        self._penalised[name] = asyncio.get_running_loop().time() + PENALTY_S
        if self.unheld >= self.total:
            return False
        self.open -= 1
        self.unheld += 1
        freed, self._freed = self._freed, asyncio.Event()
        freed.set()
        return True

    def release(self, name: str, held: bool = True) -> None:
        """Give back a slot :meth:`acquire` took for ``name`` (``held``: still counted in
        the hub's total, :meth:`unhold`); wakes the waiting."""
        if held:
            self.open -= 1
        else:
            self.unheld -= 1
        self._open[name] -= 1
        if not self._open[name]:
            del self._open[name]
        freed, self._freed = self._freed, asyncio.Event()
        freed.set()

    async def _wait(self, name: str) -> None:
        if self.wait_s <= 0 or self._waiting[name] >= WAITING_PER_SLOT * self.per_token:
            self._refuse(name)
        self._waiting[name] += 1
        deadline = asyncio.get_running_loop().time() + self.wait_s
        try:
            while not self._free_for(name):
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    self._refuse(name)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._freed.wait(), left)
        finally:
            self._waiting[name] -= 1
            if not self._waiting[name]:
                del self._waiting[name]

    def _refuse(self, name: str) -> None:
        mine = self._open[name]
        raise QuotaExceeded(
            "streams",
            f"{self.open} {self.kind} streams are open ({mine} for token {name}); this hub "
            f"keeps at most {self.total} ({self.flag}), {self.per_token} per token, the last "
            f"{reserved_slots(self.total)} for tokens holding fewer than "
            f"{reserved_below(self.per_token)}: "
            "finish or cancel some, or retry",
        )


class ReplyHold:
    """One call's slot of ``slots`` for ``name``, from its start until gRPC reports it done
    (:meth:`done`); while armed (a reply or message is the client's to take), once it has
    waited :data:`REPLY_S` the slot stops counting in the hub's total
    (:meth:`StreamSlots.unhold`) and counts in the token's share only. Event loop only."""

    def __init__(self, slots: StreamSlots, name: str) -> None:
        self._slots, self._name = slots, name
        self._held, self._ended = True, False
        self._timer: asyncio.TimerHandle | None = None

    def arm(self) -> None:
        """A reply is waiting for the client from now on."""
        self.disarm()
        if not self._ended:
            self._timer = asyncio.get_running_loop().call_later(REPLY_S, self._unhold)

    def disarm(self) -> None:
        """The client took it."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _unhold(self) -> None:
        if self._held and not self._ended:
            self._held = not self._slots.unhold(self._name)

    def done(self, _: object = None) -> None:
        """The call ended: its slot is given back (once)."""
        if self._ended:
            return
        self._ended = True
        self.disarm()
        self._slots.release(self._name, self._held)
