"""The single-flight table: one entry per digest being fetched, one queue per class, and
the byte counts of both.

A flight goes ``QUEUED`` → ``WIRE`` (its batch left) → ``ADMITTING`` (it arrived, its
disk write runs) → resolved (out of the table); a batch cancelled part-way leaves what
never arrived ``LEFT``. A later request for the same digest joins the flight and may raise
its class (a queued flight moves to the new class's queue; its old entry goes stale and is
skipped). Every count — per class, the blocks and bytes queued; the bytes on the wire, being
admitted, on the way, and of speculative classes — follows from the flights' states, and
only :meth:`FlightTable._count` changes them: a flight's bytes leave its old state's counts
and join its new one's in the same step, so no count can drift from the table.

Everything runs on the daemon's event loop (no locks).
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from enum import Enum, auto
from typing import TYPE_CHECKING

from spoke import metrics
from spoke.fetch.ledger import Source
from spoke.fetch.priority import SPECULATIVE, Priority

if TYPE_CHECKING:
    from spoke.cache.blockcache import Placement
    from spoke.fetch.pacer import Stream


class State(Enum):
    """Where a flight is."""

    QUEUED = auto()  # waiting in its class's queue
    WIRE = auto()  # asked of the source, not arrived
    ADMITTING = auto()  # arrived, its disk write not done
    LEFT = auto()  # its batch ended (cancelled) before it arrived
    DONE = auto()  # resolved: out of the table


def _retrieve(future: asyncio.Future[bytes | None]) -> None:
    if not future.cancelled():
        future.exception()  # a prefetch nobody waits for must not log "never retrieved"


@dataclass(eq=False)
class Flight:
    """One digest being fetched, and who waits for it.

    Attributes:
        sent_as: the class its batch left in.
        source: who asked for it ahead of any reader (the ledger's), if nobody else has.
        demanded: a reader joined after it left.
        placed: how the cache admits it, once its admission chose
            (:meth:`~spoke.fetch.scheduler.FetchScheduler.placement`).
        read_early: read while its admission ran (a hit the mount reported, or a reader
            joining after it was placed ahead of readers), which the policy could not
            record then: :meth:`~spoke.fetch.scheduler.FetchScheduler.resolved` does.
        stream: the stream it left on.
    """

    digest: str
    size: int
    priority: Priority
    future: asyncio.Future[bytes | None]
    state: State = State.QUEUED
    sent_as: Priority | None = None
    source: Source | None = None
    demanded: bool = False
    placed: Placement | None = None
    read_early: bool = False
    stream: Stream | None = None


@dataclass
class Queued:
    """A class's queue: its entries (stale ones included), and the live ones' count and
    bytes."""

    flights: deque[Flight]
    count: int = 0
    bytes: int = 0


class FlightTable:
    """Every fetch queued or on its way, by digest, and the queues by class."""

    def __init__(self) -> None:
        self._flights: dict[str, Flight] = {}
        self._queues = {p: Queued(deque()) for p in Priority}
        self.wire_bytes = 0
        """Bytes asked of the source, not arrived."""
        self.admitting_bytes = 0
        """Bytes arrived, not resident yet (disk writes)."""
        self.on_the_way_bytes = 0
        """Bytes of every flight in the table (queued, on the wire, or being admitted)."""
        self.speculative_bytes = 0
        """Bytes of flights of a speculative class (:data:`~spoke.fetch.priority.SPECULATIVE`)."""
        self._gauges = {
            p: (metrics.QUEUE_DEPTH.labels(p.label), metrics.QUEUED_BYTES.labels(p.label))
            for p in Priority
        }

    def __contains__(self, digest: str) -> bool:
        return digest in self._flights

    def __len__(self) -> int:
        return len(self._flights)

    def get(self, digest: str) -> Flight | None:
        """``digest``'s flight, if it is in the table."""
        return self._flights.get(digest)

    def request(
        self, digest: str, size: int, priority: Priority, source: Source | None
    ) -> tuple[Flight, bool]:
        """``digest``'s flight, a new one queued in ``priority`` unless one is in the table
        (its class raised to ``priority`` if that is more urgent); and whether it is new."""
        flight = self._flights.get(digest)
        if flight is None:
            future: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
            future.add_done_callback(_retrieve)
            flight = Flight(digest, size, priority, future, source=source)
            self._flights[digest] = flight
            self._count(flight, 1)
            self._queues[priority].flights.append(flight)
            return flight, True
        if priority < flight.priority:
            self._move(flight, flight.state, priority)
            if flight.state is State.QUEUED:
                self._queues[priority].flights.append(flight)
        return flight, False

    def head(self, priority: Priority) -> Flight | None:
        """The next live entry of ``priority``'s queue (stale ones dropped)."""
        q = self._queues[priority].flights
        while q:
            flight = q[0]
            if (
                flight.priority == priority
                and flight.state is State.QUEUED
                and self._flights.get(flight.digest) is flight
            ):
                return flight
            q.popleft()
        return None

    def take(self, priority: Priority, room: int, most: int) -> list[Flight]:
        """Up to ``most`` flights of ``priority``'s queue, put on the wire: blocks until
        ``room`` bytes are reached (at least one)."""
        batch: list[Flight] = []
        total = 0
        while len(batch) < most:
            flight = self.head(priority)
            # a stream takes blocks until it is full: rounding down instead left every
            # stream one 1 MiB chunk file when the room was just under 2 MiB, and the
            # stream count, not the window, capped the bytes on the wire
            if flight is None or (batch and total >= room):
                break
            self._queues[priority].flights.popleft()
            self._move(flight, State.WIRE, flight.priority)
            flight.sent_as = priority
            total += flight.size
            batch.append(flight)
        return batch

    def arrived(self, digest: str) -> Flight | None:
        """``digest`` arrived: its flight (if it was on the wire) is being admitted."""
        flight = self._flights.get(digest)
        if flight is None or flight.state is not State.WIRE:
            return None
        self._move(flight, State.ADMITTING, flight.priority)
        return flight

    def left(self, flight: Flight) -> None:
        """``flight``'s batch ended: if it never arrived, it is off the wire."""
        if flight.state is State.WIRE:
            self._move(flight, State.LEFT, flight.priority)

    def resolve(self, digest: str) -> Flight | None:
        """``digest`` is done: its flight leaves the table."""
        flight = self._flights.pop(digest, None)
        if flight is not None:
            self._count(flight, -1)
            flight.state = State.DONE
        return flight

    def queued(self, priority: Priority) -> tuple[int, int]:
        """Blocks and bytes of ``priority`` waiting to leave."""
        q = self._queues[priority]
        return q.count, q.bytes

    def close(self) -> list[Flight]:
        """Empty the table; returns the flights it held."""
        flights = list(self._flights.values())
        for flight in flights:
            self.resolve(flight.digest)
        return flights

    def publish(self) -> None:
        """Set the queue and in-flight gauges."""
        for p, q in self._queues.items():
            depth, queued = self._gauges[p]
            depth.set(q.count)
            queued.set(q.bytes)
        metrics.INFLIGHT_BYTES.set(self.wire_bytes)
        metrics.INFLIGHT_FETCHES.set(len(self._flights))

    def _move(self, flight: Flight, state: State, priority: Priority) -> None:
        self._count(flight, -1)
        flight.state, flight.priority = state, priority
        self._count(flight, 1)

    def _count(self, flight: Flight, sign: int) -> None:
        """Add (``sign`` 1) or take away (-1) ``flight``'s share of every count, as its
        state and class give it: the one place the counts change."""
        n = sign * flight.size
        self.on_the_way_bytes += n
        if flight.priority in SPECULATIVE:
            self.speculative_bytes += n
        if flight.state is State.QUEUED:
            q = self._queues[flight.priority]
            q.count += sign
            q.bytes += n
        elif flight.state is State.WIRE:
            self.wire_bytes += n
        elif flight.state is State.ADMITTING:
            self.admitting_bytes += n
