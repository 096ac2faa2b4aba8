"""What one token may make the hub hold for its block streams, and what all of them may.

A ``ReadBlocks`` stream holds the block it is sending in memory until the client has
taken its last chunk: a client that asks and never reads pins it. So every block a stream
loads is charged, before it is read, to the caller's share and to the hub's budget
(:class:`ReadBudget`), and released when its last chunk has left; a stream charges at
most the block it is sending and, when there is room, the next one read ahead.

Charged per block: its bytes plus two chunk-sized copies (the message being encoded and
the copy gRPC core keeps until the peer's flow-control window takes it),
``size + 2 * min(size, chunk)``; a packed run of small blocks the same over the run.

Limits, per principal (the token's id; ``anonymous`` without tokens):

- at most ``streams_per_token`` ``ReadBlocks`` streams at once (:data:`STREAMS_PER_TOKEN`),
  and at most ``total_streams`` over every principal (:data:`STREAMS`), the last eighth
  of them only for tokens holding fewer than
  :data:`~hub.limits.slots.RESERVED_BELOW` (:func:`~hub.limits.slots.slot_free`):
  one more is refused at once, ``RESOURCE_EXHAUSTED``.
- at most ``bytes_per_token`` charged at once (:data:`BYTES_PER_TOKEN`), and at most
  ``total_bytes`` over every principal (:data:`TOTAL_BYTES`). A stream with no room
  *waits* (the token holding least served first, then first come, first served) up to
  :data:`WAIT_S` for it, then is refused
  ``RESOURCE_EXHAUSTED``. Waiting, not refusing at once, because a busy region's spokes
  fill the budget in normal operation (their windows exceed what the hub holds): a full
  budget is backpressure, and a reader that gets room within seconds has lost nothing. A
  stream that holds a charge never waits for another (read-ahead only takes free room),
  so streams cannot wait on each other in a cycle. A block larger than a limit is let
  through alone when nothing else is charged (to the principal, or at all).
- a request message being received is charged too, from the moment the hub asks gRPC for
  it until it has arrived (:mod:`hub.serve.inbound`): what gRPC core may buffer for it
  (:data:`hub.serve.wire.CORE_REQUEST_BYTES`, 64 KiB). Such a charge waits ahead of the block
  charges (it is small, and it is what lets a stream or call go on), and the stream that
  takes it holds no other charge then, so the no-cycle rule above still holds.

A charge is held only while its bytes make progress: every send of a block's bytes (a
``ReadBlocks`` message, a bulk channel step of :data:`hub.serve.wire.CHUNK_BYTES`) must complete
within its deadline, ``stall_s`` (:data:`STALL_S`) per MiB and at least
:data:`STALL_FLOOR_S` (:meth:`ReadBudget.send_deadline`), or the stream ends
``RESOURCE_EXHAUSTED`` (counted ``limit="stall"``) and its charge is released; one that
reads slowly is never cut (each send is timed, not the stream). A stream's messages start
at 64 KiB and double (:class:`hub.serve.blockstream.MessageRamp`), so a client that asks and
never reads stalls on its first message and holds the budget about 2 s, not ``stall_s``.
A gRPC stream's last message stays in gRPC core until the
client reads it, cancels or goes away (``grpc.aio`` cannot reset one stream of a
connection), so that message (:func:`stalled_charge`) stays charged to the token's share,
with its stream slot, out of the hub's total into a stalled pool of half its size
(:attr:`ReadBudget.stalled`; beyond it, the hub's total takes it): what a token left
stalled bounds its own later reads, not other tokens', and what every token left stalled
is at most the pool and the total together. A token whose stalled streams hold a quarter
of its share (:attr:`ReadBudget.stalled_per_token`, 48 MiB: 24 streams stalled on a chunk)
is refused new streams at once (``limit="stall"``) until it reads or cancels them, so
tokens that stall can neither grow the hub's memory nor take the budget from the others.
A bulk connection that stalls is closed, which frees everything.

Sizing, for the shipped Deployment (``memory: 1Gi``): a serving hub holds 92 to 143 MiB
at its measured peak (``bench.rss``, local blobs and S3). Stalled streams hold at most
:data:`TOTAL_BYTES` (384 MiB) of blocks and their copies, one token at most
:data:`BYTES_PER_TOKEN` (192 MiB, half: a token that stalls leaves the other half to every
other token). A stream waiting for room holds its request and gRPC's call state: a few
KiB for a spoke's 16-digest request, at most about 120 KiB (one 64 KiB stream window of
request bytes, :data:`hub.serve.wire.CORE_REQUEST_BYTES`, and gRPC's call state), so a token's
:data:`STREAMS_PER_TOKEN` (512) streams hold at most about 60 MiB more.
143 + 384 + 60 = 587 MiB, under 1 GiB with room for the allocator's slack. Stalled
messages (charged twice their size, :func:`stalled_charge`: 128 KiB for a client that never
read, 2 MiB for one that read the 960 KiB before a chunk) add at most the stalled pool,
192 MiB; beyond it they take the hub's total, which new blocks then wait for, so
587 + 192 = 779 MiB, under 1 GiB, and only once tokens that stall have filled the pool.
While a token holding less waits, a token over its fair share (the total over the tokens
holding or waiting, :meth:`ReadBudget.outweighed`) gets 2 s, not its message's deadline,
for each send: readers that read a stream's first messages and then stop no longer hold
every other token's reads off for the 30 s of a chunk. Measured: hub/DESIGN.md (Serving)
and BENCHMARKS.md (``bench.stall_flood``).

A spoke opens at most 16 block streams (``spoke.fetch.scheduler``: 8 for every class and 8 more
for demand misses), so 512 streams is 32 spokes sharing one token at full concurrency; a
region whose nodes share one hub token and more run at once raises
``--max-streams-per-token`` (with the memory it costs, above) or gives nodes their own
tokens. Refused streams are retried by spokes (``spoke.fetch.fetcher``), within their miss
deadline.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from hub.errors import QuotaExceeded
from hub.limits.slots import reserved_below, reserved_slots, slot_free
from hub.snapshot.blocks import MiB

STREAMS_PER_TOKEN = 512
"""Default most ``ReadBlocks`` streams one token may have open (``--max-streams-per-token``)."""

STREAMS = 2048
"""Default most ``ReadBlocks`` streams open at once over every token (``--max-block-streams``):
a stream that waits for room, or for its request, holds gRPC's call state and at most one
HTTP/2 stream window of request bytes (about 120 KiB in all), so 2,048 hold about 240 MiB
however many tokens open them; 128 spokes at their full 16 streams."""

BYTES_PER_TOKEN = 192 * MiB
"""Default most block bytes the hub holds for one token's streams
(``--max-bytes-per-token``)."""

TOTAL_BYTES = 384 * MiB
"""Default most block bytes the hub holds for every stream together
(``--max-bytes-in-flight``)."""

WAIT_S = 10.0
"""Default longest a stream waits for room in the budget before it is refused, seconds
(``--budget-wait``); shorter when the call's deadline is nearer."""


STALL_S = 30.0
"""Default longest one send of a block's bytes may make no progress before its stream is
ended and its charge released, seconds (``--stall-timeout``): a reader must take a chunk
(1 MiB) within it, 35 KB/s, to be served."""


STALL_FLOOR_S = 2.0
"""Shortest time a message of a block's bytes is given to leave, seconds
(:meth:`ReadBudget.send_deadline`): a pause of the network (a TCP retransmission, a busy
client) is not a stall."""


def stalled_charge(message_bytes: int) -> int:
    """What a stream stalled on a message of ``message_bytes`` keeps until the client reads
    it or the call ends: twice the message (measured: 1,235 streams stalled on 1 MiB
    messages kept about 1.1 GiB beyond the blocks' charges; gRPC core's copy of the
    message and the frame it is being written into)."""
    return 2 * message_bytes


def stall_error(what: str, seconds: float) -> QuotaExceeded:
    """The refusal of a stream whose client took none of ``what`` within ``seconds``
    (its deadline: :meth:`ReadBudget.send_deadline`)."""
    return QuotaExceeded(
        "stall",
        f"the client took none of {what} within {seconds:.3g} s (--stall-timeout, per "
        "MiB); the "
        "stream is ended and its share of the read budget given back: read what a stream "
        "sends, or cancel it",
    )


def block_charge(size: int, chunk_bytes: int) -> int:
    """What a block (or a packed run) of ``size`` bytes costs while a stream sends it."""
    return size + 2 * min(size, chunk_bytes)


@dataclass
class _Share:
    streams: int = 0
    held: int = 0
    stalled: int = 0


@dataclass
class _Waiter:
    name: str
    amount: int
    future: asyncio.Future[None] = field(repr=False)
    ahead: bool = False


class ReadBudget:
    """Streams and bytes in flight, per principal and in total (see the module docstring).

    Seventeen methods over one ledger: every one reads or changes the same shares and
    totals under one rule (no charge passes a limit; waiters are served lightest first), so
    they stay together rather than split across objects that would share the ledger.

    One instance per server, used from its event loop only.

    Args:
        streams_per_token: Most streams open at once per principal.
        bytes_per_token: Most bytes charged at once per principal.
        total_bytes: Most bytes charged at once in total.
        wait_s: Longest a charge waits for room, seconds.
        total_streams: Most streams open at once over every principal.
        stall_s: Longest one send may make no progress, seconds (:data:`STALL_S`).
    """

    def __init__(
        self,
        streams_per_token: int = STREAMS_PER_TOKEN,
        bytes_per_token: int = BYTES_PER_TOKEN,
        total_bytes: int = TOTAL_BYTES,
        wait_s: float = WAIT_S,
        total_streams: int = STREAMS,
        stall_s: float = STALL_S,
    ) -> None:
        if min(streams_per_token, bytes_per_token, total_bytes, total_streams) < 1 or wait_s < 0:
            raise ValueError("read budget limits must be positive")
        if stall_s <= 0:
            raise ValueError("the stall timeout must be positive")
        self.streams_per_token = streams_per_token
        self.bytes_per_token = bytes_per_token
        self.total_bytes = total_bytes
        self.total_streams = total_streams
        self.wait_s = wait_s
        self.stall_s = stall_s
        self.held = 0
        self.stalled = 0
        self.stalled_pool = total_bytes // 2
        self.stalled_per_token = bytes_per_token // 4
        self.streams = 0
        self._shares: dict[str, _Share] = {}
        self._waiters: collections.deque[_Waiter] = collections.deque()

    def held_by(self, name: str) -> int:
        """Bytes charged to principal ``name`` now."""
        share = self._shares.get(name)
        return share.held if share is not None else 0

    def streams_of(self, name: str) -> int:
        """Streams principal ``name`` has open."""
        share = self._shares.get(name)
        return share.streams if share is not None else 0

    def stream_room(self, name: str) -> bool:
        """Whether principal ``name`` may open one more stream now (:func:`slot_free`, and
        under its stalled bytes' cap, :attr:`stalled_per_token`)."""
        share = self._shares.get(name)
        if share is not None and share.stalled >= self.stalled_per_token:
            return False
        return slot_free(
            self.total_streams, self.streams, self.streams_of(name), self.streams_per_token
        )

    @contextlib.contextmanager
    def stream(self, name: str) -> Iterator[None]:
        """Holds one of ``name``'s stream slots, and one of the hub's, for the ``with`` block.

        Raises:
            QuotaExceeded: ``name`` already has :attr:`streams_per_token` streams open, or
                every token together :attr:`total_streams`.
        """
        share = self._shares.setdefault(name, _Share())
        if share.stalled >= self.stalled_per_token:
            self._forget(name, share)
            raise QuotaExceeded(
                "stall",
                f"token {name} has left {share.stalled} bytes in ReadBlocks streams it "
                f"stopped reading, the most this hub allows one token "
                f"({self.stalled_per_token}): read or cancel them first",
            )
        if share.streams >= self.streams_per_token:
            self._forget(name, share)
            raise QuotaExceeded(
                "streams",
                f"token {name} has {share.streams} ReadBlocks streams open, the most this "
                f"hub allows one token (--max-streams-per-token {self.streams_per_token}); "
                "finish or cancel some first",
            )
        if not slot_free(self.total_streams, self.streams, share.streams, self.streams_per_token):
            self._forget(name, share)
            raise QuotaExceeded(
                "streams",
                f"{self.streams} ReadBlocks streams are open ({share.streams} for token "
                f"{name}); this hub allows {self.total_streams} (--max-block-streams), the "
                f"last {reserved_slots(self.total_streams)} only to tokens holding fewer "
                f"than {reserved_below(self.streams_per_token)}; retry",
            )
        share.streams += 1
        self.streams += 1
        try:
            yield
        finally:
            share.streams -= 1
            self.streams -= 1
            self._forget(name, share)

    def _fits(self, name: str, amount: int) -> bool:
        held = self.held_by(name)
        mine = held == 0 or held + amount <= self.bytes_per_token
        total = self.held == 0 or self.held + amount <= self.total_bytes
        return mine and total

    def try_take(self, name: str, amount: int) -> bool:
        """Charges ``amount`` to ``name`` if it fits now and no stream that could be
        served waits before it; never waits."""
        if not self._fits(name, amount) or any(self._servable(w) for w in self._waiters):
            return False
        self._take(name, amount)
        return True

    def _servable(self, waiter: _Waiter) -> bool:
        """Whether ``waiter`` waits for the hub's room, not for its own principal's."""
        held = self.held_by(waiter.name)
        return held == 0 or held + waiter.amount <= self.bytes_per_token

    async def take(
        self, name: str, amount: int, timeout_s: float | None = None, ahead: bool = False
    ) -> None:
        """Charges ``amount`` to ``name``, waiting (in arrival order) for room.

        Args:
            name: The principal.
            amount: Bytes.
            timeout_s: Longest wait, seconds; :attr:`wait_s` when None or longer.
            ahead: Wait before the block charges already waiting (a request being
                received, :mod:`hub.serve.inbound`: small, and what lets its stream go on).

        Raises:
            QuotaExceeded: No room came within the wait.
        """
        wait = self.wait_s if timeout_s is None else max(0.0, min(timeout_s, self.wait_s))
        waiter = _Waiter(name, amount, asyncio.get_running_loop().create_future(), ahead)
        if ahead:
            self._waiters.appendleft(waiter)
        else:
            self._waiters.append(waiter)
        self._wake()
        if waiter.future.done():
            return
        started = time.monotonic()
        try:
            await asyncio.wait_for(asyncio.shield(waiter.future), wait)
        except TimeoutError:
            if waiter.future.done() and not waiter.future.cancelled():
                return  # granted just as the wait ended: keep it
            waiter.future.cancel()
            mine = self.held_by(name)
            raise QuotaExceeded(
                "bytes",
                f"the hub holds {mine} bytes of blocks for token {name}'s streams "
                f"(its share: --max-bytes-per-token {self.bytes_per_token}) and "
                f"{self.held} bytes in all (--max-bytes-in-flight {self.total_bytes}); "
                f"no room for {amount} more bytes within {time.monotonic() - started:.1f} s: "
                "read what the open streams are sending, or retry",
            ) from None
        except BaseException:
            if waiter.future.done() and not waiter.future.cancelled():
                self.release(name, amount)
            else:
                waiter.future.cancel()
            raise
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)
            self._wake()

    def release(self, name: str, amount: int) -> None:
        """Gives back ``amount`` bytes charged to ``name``; wakes the waiters that fit."""
        share = self._shares.get(name)
        if share is None:
            return
        share.held -= amount
        self.held -= amount
        self._forget(name, share)
        self._wake()

    def send_deadline(self, message_bytes: int) -> float:
        """Longest one message of ``message_bytes`` may take to leave before its stream is
        ended as stalled, seconds: :attr:`stall_s` per MiB (a reader must keep up with
        1 MiB per stall timeout), at least :data:`STALL_FLOOR_S` (or :attr:`stall_s`
        when that is shorter). A stream's first messages are small
        (:class:`hub.serve.blockstream.MessageRamp`), so a client that never reads is found
        within seconds, not a whole stall timeout."""
        return max(min(self.stall_s, STALL_FLOOR_S), self.stall_s * message_bytes / MiB)

    def outweighed(self, name: str) -> bool:
        """Whether ``name`` holds more than its fair share of the budget while a token
        holding less waits for room: then a send of ``name``'s that has not left within
        :data:`STALL_FLOOR_S` is ended as stalled
        (:func:`hub.serve.sending.send_blocks`)
        rather than at its full deadline.

        The fair share is :attr:`total_bytes` over the tokens holding or waiting. Found by
        issue 39's second re-probe: clients that read a stream's first 960 KiB (the message
        ramp) and then stop hold their blocks' charges for the 1 MiB message's 30 s, and
        two tokens doing so refused every other token's reads for minutes."""
        waiting = [w for w in self._waiters if not w.future.done()]
        if not waiting:
            return False
        mine = self.held_by(name)
        names = {w.name for w in waiting} | set(self._shares)
        if mine <= self.total_bytes // max(1, len(names)):
            return False
        return any(self.held_by(w.name) < mine for w in waiting)

    def take_stalled(self, name: str, amount: int) -> bool:
        """Charges what gRPC core keeps for one of ``name``'s stalled streams
        (:func:`stalled_charge`) to ``name``'s share and, when it has room, to the stalled
        pool instead of the hub's total; never waits (the bytes are held already).

        Returns:
            Whether it went to the stalled pool (pass it to :meth:`release_stalled`).
        """
        pooled = self.stalled + amount <= self.stalled_pool
        share = self._shares.setdefault(name, _Share())
        share.held += amount
        share.stalled += amount
        if pooled:
            self.stalled += amount
        else:
            self.held += amount
        return pooled

    def release_stalled(self, name: str, amount: int, pooled: bool) -> None:
        """Gives back a charge :meth:`take_stalled` made; wakes the waiters that fit."""
        share = self._shares.get(name)
        if share is None:
            return
        share.held -= amount
        share.stalled -= amount
        if pooled:
            self.stalled -= amount
        else:
            self.held -= amount
        self._forget(name, share)
        self._wake()

    def _take(self, name: str, amount: int) -> None:
        self._shares.setdefault(name, _Share()).held += amount
        self.held += amount

    def _forget(self, name: str, share: _Share) -> None:
        if share.streams == 0 and share.held == 0:
            self._shares.pop(name, None)

    def _wake(self) -> None:
        """Grants waiting charges, request charges first, then the principal that holds
        least first (in arrival order among equals); one that does not fit is passed over
        only when its principal is at its own share (others must not wait behind it).

        Least-held first, not arrival order: tokens that keep opening streams they never
        read queue many waiters, and in arrival order they took every byte the stall
        deadline gave back, so a token that held nothing was refused for as long as they
        went on (a probe of issue 39: 0 of 14 reads served in 200 s)."""
        for waiter in [w for w in self._waiters if w.future.done()]:
            self._waiters.remove(waiter)
        granted = True
        while granted:
            granted = False
            order = sorted(self._waiters, key=lambda w: (not w.ahead, self.held_by(w.name)))
            for waiter in order:
                if self._fits(waiter.name, waiter.amount):
                    self._take(waiter.name, waiter.amount)
                    waiter.future.set_result(None)
                    self._waiters.remove(waiter)
                    granted = True
                    break  # the holdings changed: order again
                if self._servable(waiter):
                    return  # the hub is full: nobody after it may jump ahead
