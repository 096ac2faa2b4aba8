"""The fetch scheduler: every block the spoke fetches goes through one queue per request
class, and a window of bytes on the wire sized to fill the link.

Classes, most urgent first (:class:`Priority`): a **demand** miss (a reader waits), a
**peer**'s request (another spoke of the region asked this one, its owner; it never
preempts local demand and never takes demand's own streams), a **hinted** prefetch (a job
said it reads this next), **readahead** (the reader reads in order), **prewarm** (an
operator asked), **fill** (the rest of a snapshot being read).

The scheduler puts together parts that each own one concern:

* **A block's life** (:mod:`spoke.fetch.life`). One state machine per digest, whatever
  its class, from wanted to resident (single flight: a later request for the same digest
  joins it, and raises its class if more urgent — a demand miss on a block still queued
  for readahead moves it to the demand queue); it owns who waits, the placement and
  whether the block was read, keeps every byte count, and tells its subscribers — this
  scheduler, the ledger, the policy, the metrics — of every transition. The fetcher
  writes through a sink (:mod:`spoke.fetch.sink`) that moves the lives; nobody is called
  back from inside a fetch.
* **Pacing** (:mod:`spoke.fetch.pacer`). Demand batches leave at once, on streams of
  their own; other classes leave, most urgent first, only while the link window has room,
  split over several streams. Concurrent demand misses gather: while a demand stream
  waits for its first block, new misses wait (at most ``demand_gather_s``) and leave
  together on one stream, so many readers' small misses make few streams
  (:mod:`spoke.fetch.gather`).
* **Deadlines** are the fetcher's (:mod:`spoke.fetch.deadlines`): a reader's wait is one
  it asks the fetcher for, the scheduler never reads the fetcher's state.
* **Ledger and feedback** (:mod:`spoke.fetch.ledger`). A fetch asked for ahead of any
  reader has a source (hint, in-file readahead, cross-file readahead, fill): counted
  issued when it arrives, used when read, wasted when evicted unread (it hears all three
  from the block's life; the scheduler subscribes to the access log to tell the lives of
  reads); a source whose blocks go unread has its window shrunk, down
  to off, and requests past its window are dropped.
* **Room.** Readahead is dropped when the cache has no room for it above its high
  watermark (less what is on the way, :attr:`spoke.cache.blockcache.BlockCache.readahead_room`): a
  block fetched ahead never makes the cache evict one its policy ranks (it is admitted at
  the policy's cold end, :class:`spoke.cache.admission.Placement`).

Everything runs on the daemon's event loop (no locks).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Sequence

from spoke import metrics
from spoke.cache.blockcache import BlockCache
from spoke.cache.tenants import TenantShares
from spoke.fetch.fetcher import Fetcher
from spoke.fetch.gather import DEMAND_GATHER_S, DemandGather
from spoke.fetch.ledger import PrefetchLedger
from spoke.fetch.life import BlockLives
from spoke.fetch.lifestate import Event, Life
from spoke.fetch.linkshare import LinkShares
from spoke.fetch.pacer import Pacer, Stream
from spoke.fetch.priority import SPECULATIVE, Priority, Source
from spoke.fetch.sink import CacheSink
from spoke.fetch.window import LinkWindow

log = logging.getLogger(__name__)

__all__ = ["SOURCES", "SPECULATIVE", "FetchScheduler", "Priority"]

SOURCES = {Priority.HINT: Source.HINT, Priority.READAHEAD: Source.READAHEAD}
"""The source of a :meth:`FetchScheduler.prefetch` that names none, by class."""


class FetchScheduler:
    """Fetch blocks by class through one single-flight table and one link window.

    Its methods are the surface the spoke's services ask (requests, and what is on the
    way); each hands its work to the part that owns it — the lives, the pacer, the
    ledger, the fetcher — so the class is wide, not deep. It learns of arrivals as a
    subscriber of the lives (:meth:`_hear`).

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
            window at most ``prefetch_budget``; fill's at most the cache, hints' at most
            the cache or the budget, whichever is more).
        demand_gather_s: longest a demand miss is held to share a stream (0: never).
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
        demand_gather_s: float = DEMAND_GATHER_S,
    ) -> None:
        self.fetcher = fetcher
        self.cache = cache
        self.pacer = Pacer(window, max_streams, demand_streams, batch_bytes)
        self.window = self.pacer.window  # the link window the pacer keeps
        self.batch_blocks = batch_blocks
        self.prefetch_budget = prefetch_budget
        self.lives = BlockLives()
        self.sink = CacheSink(self.lives, cache, self.pacer.first_bytes)
        self.ledger = ledger or PrefetchLedger(
            {s: prefetch_budget for s in Source}
            | {Source.FILL: cache.capacity_bytes}
            # a hint's far part fills free room in plan order, as fill does (hints.py)
            | {Source.HINT: max(prefetch_budget, cache.capacity_bytes)}
        )
        self.links: LinkShares | None = None  # tenants' link shares (share_link)
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self.gather = DemandGather(self.pacer, demand_gather_s, self._pump_open)
        for subscriber in (self._hear, self.ledger.hear, self._policy_hears, _count_bytes):
            self.lives.subscribe(subscriber)
        cache.on_evict.append(self.lives.evicted)

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
                short probe: :data:`spoke.fetch.deadlines.PROBE_S`).
            NotFound: the source does not have a block.
        """
        started = time.monotonic()
        was_cached = [self.cache.contains(digest) for digest, _ in blocks]
        misses = [d for (d, _), hit in zip(blocks, was_cached, strict=True) if not hit]
        wait = self.fetcher.wait(misses)  # every deadline of this reader's is the fetcher's
        waits: list[tuple[str, int, asyncio.Future[bytes | None]]] = []
        for (digest, size), hit in zip(blocks, was_cached, strict=True):
            if hit:
                continue
            life = self._request(digest, size, priority, source)
            if source is None:  # a reader joins it (the life decides what that means)
                self.lives.read(digest, joined=True)
            waits.append((digest, size, life.future))
        if not waits:
            return was_cached, {}
        self._pump()
        uncached: dict[str, bytes] = {}
        for digest, size, future in waits:
            again = functools.partial(self._again, digest, size, priority)
            data = await wait.outcome(digest, future, again)
            if data is not None:
                uncached[digest] = data
        if priority == Priority.DEMAND:
            metrics.DEMAND_MISS_SECONDS.observe(time.monotonic() - started)
        return was_cached, uncached

    def observe(self, digests: Sequence[str], hit: bool) -> None:
        """The access log's subscriber: readers read ``digests`` — hits from the block
        files, or misses.

        A hit goes to the block's life, which knows what it means in its state
        (:meth:`spoke.fetch.life.BlockLives.read`): the first read of a prefetch cached
        unread; a read of a block whose file landed while its admission still runs (the
        policy's insert on this loop to come: the policy hears of the read when the block
        is resident); a stale file of an earlier run for a block still wanted or on the
        wire. Reads no life holds go to the ledger's ghosts.
        """
        if hit:
            digests = [d for d in digests if not self.lives.read(d)]
        self.ledger.note_read(digests)

    def _again(
        self, digest: str, size: int, priority: Priority
    ) -> asyncio.Future[bytes | None] | None:
        """A reader's own fetch of ``digest`` after the one it joined ran out of time;
        None if the block is cached now."""
        if self.cache.contains(digest):
            return None
        future = self._request(digest, size, priority).future
        self._pump()
        return future

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
        room = self.cache.readahead_room - self.lives.on_the_way_bytes
        started = 0
        for n, (digest, size) in enumerate(blocks):
            if self._known(digest):
                continue
            if priority in SPECULATIVE and (
                self.lives.speculative_bytes + size > self.prefetch_budget
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
        return self.cache.contains(digest) or digest in self.lives

    def _request(
        self, digest: str, size: int, priority: Priority, source: Source | None = None
    ) -> Life:
        return self.lives.want(digest, size, priority, source)[0]

    @property
    def prefetch_room(self) -> int:
        """Bytes of hinted or readahead requests the budget still takes."""
        return max(0, self.prefetch_budget - self.lives.speculative_bytes)

    def readahead_room(self, source: Source) -> int:
        """Bytes of readahead ``source`` may ask for now without any being dropped: what
        the prefetch budget, the cache's room above its high watermark (less what is on
        the way) and the source's window leave. A prefetcher sizes its next window by it,
        so the files it cannot have yet stay ahead of it for its next window."""
        ledger = self.ledger[source]
        room = min(
            self.prefetch_room,
            self.cache.readahead_room - self.lives.on_the_way_bytes,
            ledger.window - ledger.outstanding,
        )
        return max(0, room)

    # -- state -----------------------------------------------------------------------------

    @property
    def source_name(self) -> str:
        """Where blocks come from (the hub's ``HOST:PORT``)."""
        return self.fetcher.name

    def is_fetching(self, digest: str) -> bool:
        """True while ``digest`` is queued or on the wire."""
        return digest in self.lives

    @property
    def inflight(self) -> int:
        """Blocks queued or being fetched now."""
        return len(self.lives)

    @property
    def on_the_way_bytes(self) -> int:
        """Bytes of blocks requested and not resident yet (queued, on the wire, or being
        written to the cache)."""
        return self.lives.on_the_way_bytes

    @property
    def wire_bytes(self) -> int:
        """Bytes asked of the source that have not arrived yet."""
        return self.lives.wire_bytes

    @property
    def admitting_bytes(self) -> int:
        """Bytes that arrived and are being written to the cache."""
        return self.lives.admitting_bytes

    def queued(self, priority: Priority) -> tuple[int, int]:
        """Blocks and bytes of ``priority`` waiting to leave."""
        return self.lives.queued(priority)

    def snapshot(self) -> dict[str, object]:
        """JSON-ready state: window, rate, RTT, bytes on the wire, queues by class, and
        the prefetch ledger by source."""
        rate, rtt = self.window.rate_bps, self.window.rtt_s
        return {
            "window_bytes": self.window.bytes,
            "wire_bytes": self.lives.wire_bytes,
            "rate_bytes_per_s": round(rate) if rate is not None else None,
            "rtt_s": round(rtt, 4) if rtt is not None else None,
            "streams": self.pacer.busy,
            "queued": {
                p.label: dict(zip(("blocks", "bytes"), self.lives.queued(p), strict=True))
                for p in Priority
            },
            "prefetch": self.ledger.snapshot(),
        }

    async def close(self) -> None:
        """Cancel fetches in flight; waiters get :class:`asyncio.CancelledError`."""
        self._closed = True
        self.gather.end()
        if self.links is not None:
            self.links.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for life in self.lives.close():
            life.future.cancel()

    # -- batches ---------------------------------------------------------------------------

    def _pump(self) -> None:
        """Start batches while the pacer allows, most urgent class first."""
        while self._start():
            pass
        self.lives.publish()
        self.pacer.publish()

    def _start(self) -> bool:
        """Start one batch of the most urgent class that may leave; False if none may.

        A class whose queued lives are all held by their tenants' link shares
        (:class:`~spoke.fetch.linkshare.LinkShares`) lets the next class go; a class the pacer holds
        back holds back every less urgent one."""
        for priority in Priority:
            if self.lives.head(priority) is None:
                continue
            demand = priority == Priority.DEMAND
            if demand and self.gather.holding():
                return False  # nothing less urgent overtakes the gathering misses
            room = self.pacer.room(priority, self.lives.wire_bytes, self.lives.admitting_bytes)
            if room is None:
                return False
            allowed = None if demand or self.links is None else self.links.gate()
            batch = self.lives.take(priority, room, self.batch_blocks, allowed)
            if not batch:
                continue
            stream = self.pacer.open(len(batch), demand=demand)
            if demand:
                self.gather.end()
            for life in batch:
                life.stream = stream
            task = asyncio.create_task(self._run(batch, priority, stream))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return True
        return False

    def share_link(self, tenants: TenantShares) -> None:
        """From now on, each new life is its tenant's, and a tenant's fetches of every
        class but demand keep to its ``link_share`` of the window while another tenant
        misses (:mod:`spoke.fetch.linkshare`)."""
        self.links = LinkShares(tenants, self.lives, self.window, self._pump_open)
        self.lives.subscribe(self.links.hear)

        def tenant_of(digest: str) -> str | None:
            return tenants.attribute([digest]).get(digest)

        self.lives.tenant_of = tenant_of

    def _pump_open(self) -> None:
        if not self._closed:
            self._pump()

    async def _run(self, batch: list[Life], priority: Priority, stream: Stream) -> None:
        try:
            await self.fetcher.fetch([(f.digest, f.size) for f in batch], priority, self.sink)
        finally:
            self.pacer.release(stream)
            for life in batch:  # cancelled part-way: what never arrived leaves the wire
                self.lives.left(life)
            task = asyncio.current_task()
            if not self._closed and not (task is not None and task.cancelling()):
                self._pump()  # (not while shutting down: new tasks would never run)

    # -- subscribers of the lives ---------------------------------------------------------

    def _hear(self, event: Event, life: Life) -> None:
        """A block arrived: it leaves the wire, its stream may free its slot, the window
        has a delivery sample, and more may leave."""
        if event is Event.ARRIVED:
            self.window.on_delivered(life.size)
            if life.stream is not None:
                self.pacer.arrived(life.stream)
            self._pump()

    def _policy_hears(self, event: Event, life: Life) -> None:
        """The policy's subscriber: a block read while its admission ran (the read the
        policy could not record then, as the block was not resident to it) is recorded
        once it is resident."""
        if event is Event.RESIDENT and life.unseen:
            try:
                self.cache.record_access([life.digest])
            except Exception:  # its recency flush writes the index: the readers go on
                log.exception("recording the early read of %s failed", life.digest)


def _count_bytes(event: Event, life: Life) -> None:
    """The metrics' subscriber: bytes arrived, by the class their batch left in."""
    if event is Event.ARRIVED:
        metrics.CLASS_BYTES.labels((life.sent_as or life.priority).label).inc(life.size)
