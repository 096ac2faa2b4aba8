"""One owner of a block's life on the spoke: a state machine per digest, from the moment
something wants the block until it leaves the fetch path — and, for a block fetched ahead
of its readers, until it is read or evicted.

::

    WANTED ─sent─▶ WIRE ─arrived─▶ VERIFIED ─admitted─▶ RESIDENT ─read───▶ (out)
       │            │  └─batch cancelled─▶ LEFT  │  │         └─evicted─▶ EVICTED (out)
       │            │                       │    │  └─not kept─▶ STREAMED (out)
       └────────────┴─────── failed ────────┴────┴───────────▶ FAILED (out)

A block enters VERIFIED whole and checked: its arriving (bytes on their way in) happens in
the source — the bulk channel's receive thread, or the fetcher reading a gRPC stream —
which hands a block over only once its digest matched; a corrupt block never enters the
machine (its batch asks again, the block still on the wire). A block leaves the machine
resident (its readers' future gets None), streamed through uncached (their future gets its
bytes) or failed (the error); a block placed ahead of any reader stays, RESIDENT, until its
first read or its eviction.

What a life owns, in every state: who waits for it (one future), who asked for it ahead of
readers (``source``; ``claimed`` once a reader took the fetch over before it left), whether
a reader read it (``read``, and ``unseen`` for a read the policy could not record: the
block was not resident to it yet), how the cache places it (``placed``, chosen once, at
admission, from the first two) and the class and stream it travels in. A read is handled
by the state it finds (:meth:`BlockLives.read`), so no order of a read and an admission can
lose one — the races that earlier patches fixed one at a time ("a hit reported while its
admission still runs", "a miss that joins a fetch already placed ahead") have no seam to
fall through.

Everything else learns of a life by subscribing (:meth:`BlockLives.subscribe`): each
:class:`Event` reaches every subscriber in order, on the loop, after the state changed —
the scheduler (the pacer, the link window, the next batches), the prefetch ledger, the
policy (a read it could not see) and the metrics. Nothing in the fetch path calls them.

Counts: per class, the blocks and bytes queued; the bytes on the wire, being admitted, on
the way, and of speculative classes — all follow from the lives' states, and only
:meth:`BlockLives._count` changes them: a life's bytes leave its old state's counts and join
its new one's in the same step, so no count can drift from the table.

The states, events and transitions, and the :class:`~spoke.fetch.lifestate.Life` record
itself, are :mod:`spoke.fetch.lifestate`'s; the machine that moves lives is here.

Everything runs on the daemon's event loop (no locks).
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

from spoke import metrics
from spoke.fetch.lifestate import NEXT, Event, InvalidTransition, Life, State
from spoke.fetch.priority import SPECULATIVE, Priority, Source

HELD_SCAN = 256
"""Most queued lives one :meth:`BlockLives.take` passes over (held by their tenant's link
share) before it gives up on the class for now."""


FAIR_SCAN = 1024
"""Most queued demand lives a :meth:`BlockLives.take` puts in turns by tenant."""


def _retrieve(future: asyncio.Future[bytes | None]) -> None:
    if not future.cancelled():
        future.exception()  # a prefetch nobody waits for must not log "never retrieved"


@dataclass
class Queued:
    """A class's queue: its entries (stale ones included), and the live ones' count and
    bytes."""

    lives: deque[Life]
    count: int = 0
    bytes: int = 0


Subscriber = Callable[[Event, Life], None]


class BlockLives:
    """Every block's life from wanted to out: in flight by digest, the queues by class, and
    the resident prefetches not read yet.

    Twenty-five methods because each event of a block's life (:mod:`spoke.fetch.lifestate`:
    wanted, read, taken, arrived, admitted, streamed, failed, evicted, left) is one, and
    they all move the same state machine and byte counts; the states and transitions are
    in ``lifestate``, not here.
    """

    def __init__(self, tenant_of: Callable[[str], str | None] | None = None) -> None:
        self.tenant_of = tenant_of
        """Whose a new life is (None: no tenants), asked once per life."""
        self._flights: dict[str, Life] = {}
        self._ahead: dict[str, Life] = {}  # RESIDENT: cached ahead of their first read
        self._queues = {p: Queued(deque()) for p in Priority}
        self._subscribers: list[Subscriber] = []
        self.wire_bytes = 0
        """Bytes asked of the source, not arrived."""
        self.admitting_bytes = 0
        """Bytes arrived, not resident yet (disk writes)."""
        self.on_the_way_bytes = 0
        """Bytes of every life in flight (queued, on the wire, or being admitted)."""
        self.speculative_bytes = 0
        """Bytes in flight of a speculative class (:data:`~spoke.fetch.priority.SPECULATIVE`)."""
        self.demand: Counter[str | None] = Counter()
        """Demand lives wanted or on the wire, by tenant (kept with tenants only)."""
        self.ahead_wire: Counter[str | None] = Counter()
        """Bytes on the wire of every class but demand, by tenant (with tenants only)."""
        self._gauges = {
            p: (metrics.QUEUE_DEPTH.labels(p.label), metrics.QUEUED_BYTES.labels(p.label))
            for p in Priority
        }

    def subscribe(self, subscriber: Subscriber) -> None:
        """Call ``subscriber(event, life)`` on every transition from now on, after the
        subscribers before it."""
        self._subscribers.append(subscriber)

    def __contains__(self, digest: str) -> bool:
        """Whether ``digest`` is in flight (wanted, on the wire or being admitted)."""
        return digest in self._flights

    def __len__(self) -> int:
        return len(self._flights)

    def get(self, digest: str) -> Life | None:
        """``digest``'s life, if it is in flight."""
        return self._flights.get(digest)

    def is_unread(self, digest: str) -> bool:
        """True while ``digest`` is cached ahead of its first read."""
        return digest in self._ahead

    # -- transitions -----------------------------------------------------------------------

    def want(
        self, digest: str, size: int, priority: Priority, source: Source | None
    ) -> tuple[Life, bool]:
        """``digest``'s life in flight, a new one queued in ``priority`` unless there is one
        (its class raised to ``priority`` if that is more urgent); and whether it is new."""
        life = self._flights.get(digest)
        if life is None:
            future: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
            future.add_done_callback(_retrieve)
            life = Life(digest, size, priority, future, source=source)
            if self.tenant_of is not None:
                life.tenant = self.tenant_of(digest)
            self._flights[digest] = life
            self._count(life, 1)
            self._queues[priority].lives.append(life)
            self._publish(Event.WANTED, life)
            return life, True
        if priority < life.priority:
            self._move(life, life.state, priority)
            if life.state is State.WANTED:
                self._queues[priority].lives.append(life)
        return life, False

    def read(self, digest: str, joined: bool = False) -> bool:
        """A reader read ``digest`` (a hit on its block file), or ``joined`` its fetch (a
        miss that waits for it); handled by the life's state:

        - wanted: a reader joining a prefetch takes it over (CLAIMED);
        - on the wire or left: a joining reader makes it read (placed as a reader's);
        - verified: read, and ``unseen`` (the policy hears of it when it is resident);
        - resident ahead of readers: its first read (READ, out of the machine).

        A hit for a block wanted or on the wire is a stale block file of an earlier run and
        marks nothing.

        Returns:
            True if it was a resident prefetch's first read.
        """
        life = self._flights.get(digest)
        if life is None:
            life = self._ahead.get(digest)
            if life is None:
                return False
            del self._ahead[digest]
            life.read = True
            self._to(life, State.DONE)
            self._publish(Event.READ, life)
            return True
        if life.state is State.VERIFIED:
            life.read = life.unseen = True
        elif joined:
            if life.state is State.WANTED:
                if life.prefetch is not None:
                    life.claimed = True
                    self._publish(Event.CLAIMED, life)
            else:
                life.read = True
        return False

    def take(
        self,
        priority: Priority,
        room: int,
        most: int,
        allowed: Callable[[Life], bool] | None = None,
    ) -> list[Life]:
        """Up to ``most`` lives of ``priority``'s queue, put on the wire: blocks until
        ``room`` bytes are reached (at least one). Lives ``allowed`` refuses (a tenant over
        its link share) stay queued, in order; at most :data:`HELD_SCAN` are passed over.
        With tenants, demand is taken in turns by tenant (:meth:`_in_turns`)."""
        if priority is Priority.DEMAND and self.tenant_of is not None:
            self._in_turns(priority)
        batch: list[Life] = []
        held: list[Life] = []
        total = 0
        queue = self._queues[priority].lives
        while len(batch) < most and len(held) < HELD_SCAN:
            life = self.head(priority)
            # a stream takes blocks until it is full: rounding down instead left every
            # stream one 1 MiB chunk file when the room was just under 2 MiB, and the
            # stream count, not the window, capped the bytes on the wire
            if life is None or (batch and total >= room):
                break
            queue.popleft()
            if allowed is not None and not allowed(life):
                held.append(life)
                continue
            self._move(life, State.WIRE, life.priority)
            life.sent_as = priority
            total += life.size
            batch.append(life)
        queue.extendleft(reversed(held))
        for life in batch:
            self._publish(Event.SENT, life)
        return batch

    def _in_turns(self, priority: Priority) -> None:
        """Put the first :data:`FAIR_SCAN` lives of ``priority``'s queue in turns by
        tenant (each tenant's in their order): one tenant's many readers missing at once
        queued every other tenant's miss behind theirs, in the batch and on the wire (issue
        39's nineteenth probe: 64 readers of one team made another team's misses p50 0.15
        to 1.2 s, 11 ms alone)."""
        queue = self._queues[priority].lives
        head: list[Life] = []
        while len(head) < FAIR_SCAN and self.head(priority) is not None:
            head.append(queue.popleft())
        turns: dict[str | None, deque[Life]] = {}
        for life in head:
            turns.setdefault(life.tenant, deque()).append(life)
        if len(turns) > 1:
            head = []
            while turns:
                for tenant, lives in list(turns.items()):
                    head.append(lives.popleft())
                    if not lives:
                        del turns[tenant]
        queue.extendleft(reversed(head))

    def arrived(self, digest: str) -> Life | None:
        """``digest`` arrived verified: its life (if it was on the wire) is being admitted;
        None if it was not on the wire (then nobody waits for it here)."""
        life = self._flights.get(digest)
        if life is None or life.state is not State.WIRE:
            return None
        self._move(life, State.VERIFIED, life.priority)
        self._publish(Event.ARRIVED, life)
        return life

    def left(self, life: Life) -> None:
        """``life``'s batch ended: if it never arrived, it is off the wire."""
        if life.state is State.WIRE:
            self._move(life, State.LEFT, life.priority)
            self._publish(Event.LEFT, life)

    def admitted(self, life: Life) -> None:
        """``life``'s block is in the cache: its readers go on; a prefetch nobody read
        stays (RESIDENT) until its first read or its eviction."""
        self._leave(life, State.DONE if life.read or life.prefetch is None else State.RESIDENT)
        if life.state is State.RESIDENT:
            self._ahead[life.digest] = life
        life.future.set_result(None)
        self._publish(Event.RESIDENT, life)

    def streamed(self, life: Life, data: bytes) -> None:
        """``life``'s block was not kept: its readers have ``data``."""
        self._leave(life, State.STREAMED)
        life.future.set_result(data)
        self._publish(Event.STREAMED, life)

    def fail(self, digest: str, error: BaseException) -> None:
        """``digest``'s fetch gave up with ``error``: its readers have it."""
        life = self._flights.get(digest)
        if life is not None:
            self._leave(life, State.FAILED)
            life.future.set_exception(error)
            self._publish(Event.FAILED, life)

    def evicted(self, digest: str, size: int) -> None:
        """The cache evicted ``digest`` (its ``on_evict`` hook): a prefetch resident and
        unread leaves, EVICTED."""
        life = self._ahead.pop(digest, None)
        if life is not None:
            self._to(life, State.EVICTED)
            self._publish(Event.EVICTED, life)

    def close(self) -> list[Life]:
        """Empty the table; returns the lives that were in flight (their futures are the
        caller's to cancel)."""
        lives = list(self._flights.values())
        for life in lives:
            self._leave(life, State.FAILED)
        self._ahead.clear()
        return lives

    # -- queues and counts -----------------------------------------------------------------

    def head(self, priority: Priority) -> Life | None:
        """The next live entry of ``priority``'s queue (stale ones dropped)."""
        q = self._queues[priority].lives
        while q:
            life = q[0]
            if (
                life.priority == priority
                and life.state is State.WANTED
                and self._flights.get(life.digest) is life
            ):
                return life
            q.popleft()
        return None

    def queued(self, priority: Priority) -> tuple[int, int]:
        """Blocks and bytes of ``priority`` waiting to leave."""
        q = self._queues[priority]
        return q.count, q.bytes

    def publish(self) -> None:
        """Set the queue and in-flight gauges."""
        for p, q in self._queues.items():
            depth, queued = self._gauges[p]
            depth.set(q.count)
            queued.set(q.bytes)
        metrics.INFLIGHT_BYTES.set(self.wire_bytes)
        metrics.INFLIGHT_FETCHES.set(len(self._flights))

    def _publish(self, event: Event, life: Life) -> None:
        for subscriber in self._subscribers:
            subscriber(event, life)

    @staticmethod
    def _check(life: Life, state: State) -> None:
        """Raises InvalidTransition unless ``life`` may move to ``state``: before anything
        changes, so a refused move leaves the life and every count as they were."""
        if state not in NEXT.get(life.state, ()):
            raise InvalidTransition(f"block {life.digest}: {life.state.name} -> {state.name}")

    def _to(self, life: Life, state: State) -> None:
        self._check(life, state)
        life.state = state

    def _leave(self, life: Life, state: State) -> None:
        """``life`` leaves the flight table for ``state``."""
        if self._flights.get(life.digest) is not life:
            raise InvalidTransition(f"block {life.digest} is not in flight")
        self._check(life, state)
        self._count(life, -1)
        life.state = state
        del self._flights[life.digest]

    def _move(self, life: Life, state: State, priority: Priority) -> None:
        if state is not life.state:
            self._check(life, state)
        self._count(life, -1)
        life.state, life.priority = state, priority
        self._count(life, 1)

    def _count(self, life: Life, sign: int) -> None:
        """Add (``sign`` 1) or take away (-1) ``life``'s share of every count, as its state
        and class give it: the one place the counts change."""
        n = sign * life.size
        self.on_the_way_bytes += n
        if life.priority in SPECULATIVE:
            self.speculative_bytes += n
        shared = self.tenant_of is not None  # per-tenant counts only with tenants' shares
        demand = life.priority == Priority.DEMAND
        if shared and demand and life.state in (State.WANTED, State.WIRE):
            self.demand[life.tenant] += sign
        if life.state is State.WANTED:
            q = self._queues[life.priority]
            q.count += sign
            q.bytes += n
        elif life.state is State.WIRE:
            self.wire_bytes += n
            if shared and not demand:
                self.ahead_wire[life.tenant] += n
        elif life.state is State.VERIFIED:
            self.admitting_bytes += n
