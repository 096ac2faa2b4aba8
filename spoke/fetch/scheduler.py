"""The fetch scheduler: every block the spoke fetches goes through one queue per request
class, and a window of bytes on the wire sized to fill the link.

Classes, most urgent first (:class:`Priority`): a **demand** miss (a reader waits), a
**peer**'s request (another spoke of the region asked this one, its owner; it never
preempts local demand and never takes demand's own streams), a **hinted** prefetch (a job
said it reads this next), **readahead** (the reader reads in order), **prewarm** (an
operator asked), **fill** (the rest of a snapshot being read).

* **Single flight.** One entry per digest being fetched, whatever its class; a later request
  for the same digest joins it (and raises its class if more urgent: a demand miss on a
  block still queued for readahead moves it to the demand queue).
* **Demand never waits behind queued work.** Demand batches leave at once, on streams of
  their own (``demand_streams`` beyond ``max_streams``); they share the link only with bytes
  already on the wire.
* **Window.** Other classes leave, most urgent first, only while the bytes asked for and
  not yet arrived stay under :attr:`spoke.fetch.window.LinkWindow.bytes` (measured rate × RTT,
  with a floor and a ceiling), split over several streams, so the link stays full without
  a long queue in front of the next demand miss.
* **Ledger and feedback** (:mod:`spoke.fetch.ledger`). A fetch asked for ahead of any reader has
  a source (hint, in-file readahead, cross-file readahead, fill): counted issued when it
  arrives, used when read (:meth:`FetchScheduler.note_read`), wasted when evicted unread;
  a source whose blocks go unread has its window shrunk, down to off, and requests past
  its window are dropped.
* **Room.** Readahead is dropped when the cache has no room for it above its high
  watermark (less what is on the way, :attr:`spoke.cache.blockcache.BlockCache.readahead_room`): a
  block fetched ahead never makes the cache evict one its policy ranks (it is admitted at
  the policy's cold end, :class:`spoke.cache.blockcache.Placement`).

Everything runs on the daemon's event loop (no locks).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from spoke import metrics
from spoke.cache.blockcache import BlockCache, Placement
from spoke.errors import MissDeadline
from spoke.fetch.fetcher import PROBE_S, Fetcher
from spoke.fetch.ledger import PrefetchLedger, Source
from spoke.fetch.window import LinkWindow


class Priority(IntEnum):
    """Request classes; a lower value is served first."""

    DEMAND = 0
    PEER = 1
    HINT = 2
    READAHEAD = 3
    PREWARM = 4
    FILL = 5

    @property
    def label(self) -> str:
        """The metric label (``demand``, ``hint``, …)."""
        return self.name.lower()


SPECULATIVE = frozenset({Priority.HINT, Priority.READAHEAD})
"""Classes bounded by the prefetch budget."""

SOURCES = {Priority.HINT: Source.HINT, Priority.READAHEAD: Source.READAHEAD}
"""The source of a :meth:`FetchScheduler.prefetch` that names none, by class."""


def _retrieve(future: asyncio.Future[bytes | None]) -> None:
    if not future.cancelled():
        future.exception()  # a prefetch nobody waits for must not log "never retrieved"


@dataclass(eq=False)
class _Flight:
    digest: str
    size: int
    priority: Priority
    future: asyncio.Future[bytes | None]
    on_wire: bool = False
    sent_as: Priority | None = None
    source: Source | None = None  # who asked for it ahead of any reader (the ledger's)
    demanded: bool = False  # a reader joined after it left
    arrived: bool = False
    admitting: bool = False  # arrived, its disk write not done
    stream: _Stream | None = None  # the stream it left on


@dataclass(eq=False)
class _Stream:
    """One batch on its way: it holds a stream slot until its last block has arrived
    (its disk writes may still be running: they are bounded by :attr:`FetchScheduler.
    admitting_bytes`, not by the stream count)."""

    waiting: int  # blocks not arrived yet
    open: bool = True  # still holds a slot


@dataclass
class _Queue:
    flights: deque[_Flight] = field(default_factory=deque)
    count: int = 0
    bytes: int = 0


class FetchScheduler:
    """Fetch blocks by class through one single-flight table and one link window.

    Args:
        fetcher: runs batches against the block source.
        cache: where blocks go (checked before anything is queued).
        window: the link's window estimator (a fresh one by default).
        max_streams: streams open at once for every class.
        demand_streams: further streams only demand misses may open.
        batch_blocks: most blocks in one stream.
        batch_bytes: most bytes in one non-demand stream.
        prefetch_budget: most bytes of hinted and readahead fetches queued or on the wire;
            requests beyond it are dropped (they are advisory).
        ledger: every prefetch source's counts and window (a fresh one by default: each
            window at most ``prefetch_budget``, fill's at most the cache).
    """

    def __init__(
        self,
        fetcher: Fetcher,
        cache: BlockCache,
        window: LinkWindow | None = None,
        max_streams: int = 8,
        demand_streams: int = 8,
        batch_blocks: int = 64,
        batch_bytes: int = 16 << 20,
        prefetch_budget: int = 256 << 20,
        ledger: PrefetchLedger | None = None,
    ) -> None:
        self.fetcher = fetcher
        self.cache = cache
        self.window = window or LinkWindow()
        self.max_streams = max_streams
        self.demand_streams = demand_streams
        self.batch_blocks = batch_blocks
        self.batch_bytes = batch_bytes
        self.prefetch_budget = prefetch_budget
        self._flights: dict[str, _Flight] = {}
        self._queues = {p: _Queue() for p in Priority}
        self._busy = 0  # stream slots held (streams with blocks still to arrive)
        self._wire_bytes = 0  # asked of the source, not arrived
        self._admitting_bytes = 0  # arrived, not resident yet (disk writes)
        self._on_the_way_bytes = 0  # queued or on the wire
        self._speculative_bytes = 0  # hinted + readahead, queued or on the wire
        self.ledger = ledger or PrefetchLedger(
            {s: prefetch_budget for s in Source} | {Source.FILL: cache.capacity_bytes}
        )
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._gauges = {
            p: (metrics.QUEUE_DEPTH.labels(p.label), metrics.QUEUED_BYTES.labels(p.label))
            for p in Priority
        }
        cache.on_evict.append(self._evicted)

    # -- requests --------------------------------------------------------------------------

    async def ensure(
        self,
        blocks: Sequence[tuple[str, int]],
        priority: Priority = Priority.DEMAND,
        source: Source | None = None,
    ) -> tuple[list[bool], dict[str, bytes]]:
        """Make every ``(digest, size)`` resident and wait for it.

        ``source`` names a prefetcher that waits for its own fetches (background fill):
        they are its in the ledger. Any other caller is a reader: joining a prefetch of
        the block makes the fetch the reader's (the source's guess was right).

        Returns:
            Per block, whether it was already cached; and the bytes of blocks that could not
            be cached (streamed through), by digest.

        Raises:
            MissDeadline: the source could not deliver before the miss deadline (or, when a
                miss of one of these blocks just gave up and nothing arrived since, within a
                short probe: :data:`spoke.fetch.fetcher.PROBE_S`).
            NotFound: the source does not have a block.
        """
        started = time.monotonic()
        was_cached: list[bool] = []
        waits: list[tuple[str, int, asyncio.Future[bytes | None]]] = []
        gave_up = next(  # a miss of one of these just gave up: this one is only a probe
            (
                error
                for digest, _ in blocks
                if not self.cache.contains(digest) and (error := self.fetcher.gave_up_on(digest))
            ),
            None,
        )
        for digest, size in blocks:
            if self.cache.contains(digest):
                was_cached.append(True)
                continue
            was_cached.append(False)
            flight = self._request(digest, size, priority, source)
            if flight.source is not None and source is None:
                self._claim(flight)
            waits.append((digest, size, flight.future))
        if not waits:
            return was_cached, {}
        self._pump()
        uncached: dict[str, bytes] = {}
        loop = asyncio.get_running_loop()
        probe_end = loop.time() + min(PROBE_S, self.fetcher.miss_deadline / 4)
        own_deadline = started + self.fetcher.miss_deadline
        for digest, size, future in waits:
            if gave_up is None:
                data = await self._wait(digest, size, priority, future, own_deadline)
            else:  # only a probe: the fetch goes on for later readers
                try:
                    # shield: a caller giving up must not cancel a fetch others wait on
                    data = await asyncio.wait_for(
                        asyncio.shield(future), max(probe_end - loop.time(), 0)
                    )
                except TimeoutError:
                    raise gave_up from None
            if data is not None:
                uncached[digest] = data
        if priority == Priority.DEMAND:
            metrics.DEMAND_MISS_SECONDS.observe(time.monotonic() - started)
        return was_cached, uncached

    async def _wait(
        self,
        digest: str,
        size: int,
        priority: Priority,
        future: asyncio.Future[bytes | None],
        deadline: float,
    ) -> bytes | None:
        """The outcome of ``digest``'s fetch for a reader whose miss deadline is
        ``deadline`` (monotonic): a fetch it joined that started earlier and ran out of time
        is followed by one of its own while the reader still has time.

        Raises:
            MissDeadline: the reader's own deadline passed too.
        """
        while True:
            try:
                # shield: a caller giving up must not cancel a fetch others wait on
                return await asyncio.shield(future)
            except MissDeadline:
                if time.monotonic() > deadline - 0.1:
                    raise
                if self.cache.contains(digest):
                    return None
                future = self._request(digest, size, priority).future
                self._pump()

    def prefetch(
        self,
        blocks: Sequence[tuple[str, int]],
        priority: Priority = Priority.READAHEAD,
        source: Source | None = None,
    ) -> int:
        """Queue blocks nobody waits for yet and return at once.

        Blocks already cached or being fetched are skipped. Hinted and readahead
        requests are advisory: ``source`` (by default the class's, :data:`SOURCES`) must
        have room in its window (requests past it are dropped and remembered, see
        :mod:`spoke.fetch.ledger`), and the rest of the request is dropped once past the
        prefetch byte budget or, for readahead, past the cache's room above its high
        watermark.

        Returns:
            How many fetches were queued.
        """
        source = source or SOURCES.get(priority)
        room = self.cache.readahead_room - self._on_the_way_bytes
        started = 0
        for n, (digest, size) in enumerate(blocks):
            if self._known(digest):
                continue
            if priority in SPECULATIVE and (
                self._speculative_bytes + size > self.prefetch_budget
                or (priority == Priority.READAHEAD and size > room)
            ):
                if source is not None:
                    rest = sum(s for d, s in blocks[n:] if not self._known(d))
                    metrics.PREFETCH_SOURCE_BYTES.labels(source, "refused").inc(rest)
                break
            if source is not None and not self.ledger.allows(source, size):
                self.ledger[source].drop(digest, size)
                continue
            self._request(digest, size, priority, source)
            room -= size
            started += 1
        if started:
            self._pump()
        return started

    def _known(self, digest: str) -> bool:
        return self.cache.contains(digest) or digest in self._flights

    @property
    def prefetch_room(self) -> int:
        """Bytes of hinted or readahead requests the budget still takes."""
        return max(0, self.prefetch_budget - self._speculative_bytes)

    def readahead_room(self, source: Source) -> int:
        """Bytes of readahead ``source`` may ask for now without any being dropped: what
        the prefetch budget, the cache's room above its high watermark (less what is on
        the way) and the source's window leave. A prefetcher sizes its next window by it,
        so the files it cannot have yet stay ahead of it for its next window."""
        ledger = self.ledger[source]
        room = min(
            self.prefetch_room,
            self.cache.readahead_room - self._on_the_way_bytes,
            ledger.window - ledger.outstanding,
        )
        return max(0, room)

    def note_read(self, digests: Sequence[str]) -> None:
        """Readers read these blocks: prefetches among them were used (the ledger)."""
        self.ledger.note_read(digests)

    # -- state -----------------------------------------------------------------------------

    @property
    def source_name(self) -> str:
        """Where blocks come from (the hub's ``HOST:PORT``)."""
        return self.fetcher.source.name

    def request_of(self, digest: str) -> tuple[int, Priority] | None:
        """Size (bytes) and class of ``digest``'s fetch while it is queued or on the wire;
        None otherwise (a regional peer is asked with both)."""
        flight = self._flights.get(digest)
        return None if flight is None else (flight.size, flight.sent_as or flight.priority)

    def is_fetching(self, digest: str) -> bool:
        """True while ``digest`` is queued or on the wire."""
        return digest in self._flights

    @property
    def inflight(self) -> int:
        """Blocks queued or being fetched now."""
        return len(self._flights)

    @property
    def on_the_way_bytes(self) -> int:
        """Bytes of blocks requested that have not arrived yet (queued or on the wire;
        once a block arrives, the cache counts it as being admitted)."""
        return self._on_the_way_bytes

    @property
    def wire_bytes(self) -> int:
        """Bytes asked of the source that have not arrived yet."""
        return self._wire_bytes

    @property
    def admitting_bytes(self) -> int:
        """Bytes that arrived and are being written to the cache."""
        return self._admitting_bytes

    def queued(self, priority: Priority) -> tuple[int, int]:
        """Blocks and bytes of ``priority`` waiting to leave."""
        q = self._queues[priority]
        return q.count, q.bytes

    def snapshot(self) -> dict[str, object]:
        """JSON-ready state: window, rate, RTT, bytes on the wire, queues by class, and
        the prefetch ledger by source."""
        rate, rtt = self.window.rate_bps, self.window.rtt_s
        return {
            "window_bytes": self.window.bytes,
            "wire_bytes": self._wire_bytes,
            "rate_bytes_per_s": round(rate) if rate is not None else None,
            "rtt_s": round(rtt, 4) if rtt is not None else None,
            "streams": self._busy,
            "queued": {
                p.label: {"blocks": q.count, "bytes": q.bytes} for p, q in self._queues.items()
            },
            "prefetch": self.ledger.snapshot(),
        }

    async def close(self) -> None:
        """Cancel fetches in flight; waiters get :class:`asyncio.CancelledError`."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for flight in list(self._flights.values()):
            flight.future.cancel()
        self._flights.clear()

    # -- internals -------------------------------------------------------------------------

    def _request(
        self, digest: str, size: int, priority: Priority, source: Source | None = None
    ) -> _Flight:
        flight = self._flights.get(digest)
        if flight is None:
            future: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
            future.add_done_callback(_retrieve)
            flight = _Flight(digest, size, priority, future, source=source)
            self._flights[digest] = flight
            self._on_the_way_bytes += size
            if priority in SPECULATIVE:
                self._speculative_bytes += size
            if source is not None:
                self.ledger.requested(source, size)
            self._enqueue(flight)
        elif priority < flight.priority:
            if not flight.on_wire:  # leave the old queue (its entry goes stale) for this one
                old = self._queues[flight.priority]
                old.count -= 1
                old.bytes -= flight.size
            if flight.priority in SPECULATIVE and priority not in SPECULATIVE:
                self._speculative_bytes -= flight.size
            flight.priority = priority
            if not flight.on_wire:
                self._enqueue(flight)
        return flight

    def _claim(self, flight: _Flight) -> None:
        """A reader waits for a block a prefetch source asked for: the fetch is the
        reader's now (placed as a demand miss), and the source's guess was right."""
        if flight.on_wire:
            flight.demanded = True  # counted issued and used when it arrives
        elif flight.source is not None:
            self.ledger.claimed(flight.source, flight.size)
            flight.source = None

    def _enqueue(self, flight: _Flight) -> None:
        q = self._queues[flight.priority]
        q.flights.append(flight)
        q.count += 1
        q.bytes += flight.size

    def _head(self, priority: Priority) -> _Flight | None:
        """The next live entry of a queue (stale ones dropped)."""
        q = self._queues[priority].flights
        while q:
            flight = q[0]
            if (
                flight.priority == priority
                and not flight.on_wire
                and flight.digest in self._flights
            ):
                return flight
            q.popleft()
        return None

    def _pump(self) -> None:
        """Start batches while the rules allow, most urgent class first."""
        while True:
            priority = next((p for p in Priority if self._head(p) is not None), None)
            if priority is None:
                break
            if priority == Priority.DEMAND:
                if self._busy >= self.max_streams + self.demand_streams:
                    break
                room = self.batch_bytes  # demand ignores the window
            else:
                window = self.window.bytes
                per_stream = min(self.batch_bytes, window // self.max_streams)
                # a stream's worth of room, or nothing: a sliver of room would open a
                # stream of one small block, and a round trip per block is what the
                # window is there to avoid. Arrived blocks waiting for their disk writes
                # count too, so a disk slower than the link holds prefetch back instead of
                # filling memory.
                if self._busy >= self.max_streams or (
                    self._wire_bytes + self._admitting_bytes + per_stream > 2 * window
                    and self._wire_bytes + self._admitting_bytes > 0
                ):
                    break
                if self._wire_bytes + per_stream > window and self._wire_bytes > 0:
                    break
                room = per_stream
            self._start(self._take(priority, room))
        self._publish()

    def _take(self, priority: Priority, room: int) -> list[_Flight]:
        batch: list[_Flight] = []
        total = 0
        q = self._queues[priority]
        while len(batch) < self.batch_blocks:
            flight = self._head(priority)
            # a stream takes blocks until it is full: rounding down instead left every
            # stream one 1 MiB chunk file when the room was just under 2 MiB, and the
            # stream count, not the window, capped the bytes on the wire
            if flight is None or (batch and total >= room):
                break
            q.flights.popleft()
            q.count -= 1
            q.bytes -= flight.size
            flight.on_wire = True
            flight.sent_as = priority
            total += flight.size
            batch.append(flight)
        return batch

    def _start(self, batch: list[_Flight]) -> None:
        self._busy += 1
        self._wire_bytes += sum(f.size for f in batch)
        stream = _Stream(len(batch))
        for flight in batch:
            flight.stream = stream
        task = asyncio.create_task(self._run(batch, stream))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: list[_Flight], stream: _Stream) -> None:
        try:
            await self.fetcher.fetch([f.digest for f in batch], self)
        finally:
            self._release(stream)
            for flight in batch:  # cancelled part-way: what never arrived leaves the wire
                if not flight.arrived:
                    flight.arrived = True
                    self._wire_bytes -= flight.size
            task = asyncio.current_task()
            if not self._closed and not (task is not None and task.cancelling()):
                self._pump()  # (not while shutting down: new tasks would never run)

    # -- FetchListener ---------------------------------------------------------------------

    def first_bytes(self, seconds: float, nbytes: int) -> None:
        """A stream's first block came back: a round-trip sample, less its transfer time."""
        rate = self.window.rate_bps
        transfer = nbytes / rate if rate else 0.0
        self.window.on_rtt(max(seconds - transfer, seconds / 2))

    def arrived(self, digest: str, nbytes: int) -> None:
        """A verified block arrived: it leaves the wire, and the window may admit more."""
        self.window.on_delivered(nbytes)
        flight = self._flights.get(digest)
        if flight is not None and not flight.arrived:
            flight.arrived = True
            self._wire_bytes -= flight.size
            self._admitting_bytes += flight.size
            flight.admitting = True
            metrics.CLASS_BYTES.labels((flight.sent_as or flight.priority).label).inc(nbytes)
            if flight.stream is not None:
                flight.stream.waiting -= 1
                if flight.stream.waiting <= 0:  # nothing more to come on it: a slot frees
                    self._release(flight.stream)
        self._pump()

    def _release(self, stream: _Stream) -> None:
        if stream.open:
            stream.open = False
            self._busy -= 1

    def resolved(self, digest: str, error: BaseException | None, data: bytes | None) -> None:
        """A block is done: resident, streamed through, or failed."""
        flight = self._flights.pop(digest, None)
        if flight is None:
            return
        self._on_the_way_bytes -= flight.size
        if flight.priority in SPECULATIVE:
            self._speculative_bytes -= flight.size
        if not flight.arrived:  # failed before arriving
            flight.arrived = True
            self._wire_bytes -= flight.size
        if flight.admitting:
            flight.admitting = False
            self._admitting_bytes -= flight.size
        if flight.source is not None:
            if error is not None:
                self.ledger.released(flight.source, flight.size)
            elif data is None or flight.demanded:  # cached, or a reader got its bytes
                self.ledger.arrived(flight.source, digest, flight.size, read=flight.demanded)
            else:  # arrived, and the cache had no room for it
                self.ledger.discarded(flight.source, flight.size)
        if not flight.future.done():
            if error is None:
                flight.future.set_result(data)
            else:
                flight.future.set_exception(error)

    def placement(self, digest: str) -> Placement:
        """How the cache admits an arrived block: ahead of its readers while only its
        prefetch source asked for it (a hint's, or readahead's and fill's, which must
        find room), as a reader's otherwise."""
        flight = self._flights.get(digest)
        if flight is None or flight.source is None or flight.demanded:
            return Placement.DEMAND
        return Placement.HINTED if flight.source is Source.HINT else Placement.AHEAD

    def _evicted(self, digest: str, size: int) -> None:
        self.ledger.evicted(digest, size)

    def _publish(self) -> None:
        for p, q in self._queues.items():
            depth, queued = self._gauges[p]
            depth.set(q.count)
            queued.set(q.bytes)
        metrics.INFLIGHT_BYTES.set(self._wire_bytes)
        metrics.WINDOW_BYTES.set(self.window.bytes)
        metrics.INFLIGHT_FETCHES.set(len(self._flights))
        if (rate := self.window.rate_bps) is not None:
            metrics.LINK_RATE.set(rate)
        if (rtt := self.window.rtt_s) is not None:
            metrics.LINK_RTT.set(rtt)
