"""Hint-driven prefetch: install read-order hints and keep fetching ahead of the readers.

``POST /v1/hints`` resolves a job's planned file order into blocks and installs it as one
stream of the cache's :class:`spoke.cache.hinted.HintedPolicy` (one stream per rank: a new post
replaces only its own stream). As the mount reports reads, the cursors move and the
service tops up a window of the soonest planned blocks not yet cached.

Two parts: the **near** blocks (the next ``window_bytes`` of planned reads) go out as
hinted prefetches, ahead of readahead, soonest first; once all of them are on their way,
the **far** ones (the rest of the plan, as far as the cache's free room goes, less a
window's worth kept free) follow in plan order behind every other class, so the link
stays busy with the plan as background fill would keep it busy with the snapshot (fill
waits while a hint is installed). A reader's demand miss never waits behind either
(:mod:`spoke.fetch.pacer`).

Prefetching never costs a fetch that Belady's MIN would not make: a planned block is
fetched early only into free room, or in place of a block whose next planned read comes
*later* than its own; MIN would evict that block for it on the miss anyway. Anything
else waits until it is nearer. (While a stream is installed the cache evicts only as
admissions need room, :attr:`spoke.cache.hinted.HintedPolicy.evict_on_demand`, so it keeps all
of its capacity.) (With uniform block sizes a prefetch schedule that follows this rule makes
exactly MIN's fetches, only earlier; Cao, Felten, Karlin & Li, "A Study of Integrated
Prefetching and Caching Strategies", SIGMETRICS 1995, rule "do no harm".)

A stream nobody reads from or posts to for ``idle_s`` seconds is dropped (a job that
ended without deleting its hint must not steer eviction forever).

Memory is capped: at most :data:`MAX_STREAMS` streams, :data:`MAX_STREAM_POSITIONS`
planned reads a stream, :data:`MAX_TOTAL_POSITIONS` over all streams and
:data:`MAX_TOTAL_BLOCKS` distinct blocks (summed per stream), :data:`MAX_STREAM_PLANS`
posts kept per stream; a post past one is refused with :class:`~spoke.errors.OverLimit`
naming it (a 400 whose body says which limit and its value). A post for a scoped admin token
(:class:`HintShare`) also keeps to its share of the two totals, counted over the installed
streams that read only its datasets (``tenant_positions``, ``tenant_blocks``), and leaves
the operator's reserve of each (``reserve_positions``, ``reserve_blocks``). Plans are compact
(:mod:`spoke.cache.hintplan`: 8 bytes a planned read, about 100 a distinct block), so the
caps hold the hints to about 330 MiB at worst. :meth:`HintService.post` builds a plan in a
worker thread (one post at a time), so the event loop only installs it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spoke.cache.hinted import HintedPolicy, HintPlan, HintStream
from spoke.cache.hintplan import PlanBuilder, PlanLimit
from spoke.errors import OverLimit
from spoke.fetch.priority import Priority, Source
from spoke.prefetch.hintcaps import Cap, CappedBuilder, HintShare, held, shared_caps

if TYPE_CHECKING:
    from spoke.cache.blockcache import BlockCache
    from spoke.fetch.scheduler import FetchScheduler

log = logging.getLogger(__name__)

MAX_STREAMS = 64
"""Hint streams installed at once (ranks of every job on one node)."""

MAX_STREAM_POSITIONS = 4_000_000
"""Most planned reads one stream holds (appends beyond it are refused)."""

MAX_TOTAL_POSITIONS = 16_000_000
"""Most planned reads all streams hold together (8 bytes each: 128 MiB)."""

MAX_TOTAL_BLOCKS = 2_000_000
"""Most distinct blocks all streams plan, summed per stream (about 100 bytes each)."""

MAX_STREAM_PLANS = 16
"""Most posts a stream keeps (a post is dropped once its reads are behind the cursor)."""

MAX_LOOKAHEAD = 1024
"""Most planned positions per stream a prefetch plan looks at."""

IDLE_S = 900.0
"""A stream without a read or a post for this long is dropped, seconds."""

FAR_PLAN_S = 0.5
"""Shortest time between two plans that look past the window, seconds. The near window is
planned on every reported read (every 10 ms while a trainer reads); the far part walks up
to :data:`MAX_LOOKAHEAD` positions per stream, and this bounds that walk to twice a
second. Half a second of link is a small part of the far part, which only fills free
room. (`bench.hint_start --rows hints,fill --repeat 2` showed no difference beyond its
noise between 0.5 and 0: the hinted run's extra CPU is elsewhere, see BENCHMARKS.md.)"""


@dataclass(frozen=True)
class HintStatus:
    """One stream as the admin API shows it."""

    stream: str
    source: str
    hint_length: int
    cursor: int
    remaining: int
    idle_s: float

    def public(self) -> dict[str, object]:
        """JSON-ready view."""
        return {
            "stream": self.stream,
            "source": self.source,
            "hint_length": self.hint_length,
            "cursor": self.cursor,
            "remaining": self.remaining,
            "idle_s": round(self.idle_s, 3),
        }


class HintService:
    """Installs hint streams in the cache's :class:`HintedPolicy` and prefetches ahead.

    Sixteen methods because the service is the one place where a stream's life (room,
    install, post, remove, expire), the readers' progress (observe, hold, release) and the
    plan ahead of them (plan, plan_parts, prefetch_ahead) all read and write the same
    streams on the event loop; split, each half would need the other's state.

    Args:
        cache: its policy must be a :class:`HintedPolicy`.
        scheduler: prefetches through
            :meth:`spoke.fetch.scheduler.FetchScheduler.prefetch`, as hinted (the class
            after demand misses).
        window_bytes: how many bytes of planned reads ahead of the readers to look at for
            prefetch (cached ones included); at most half the cache. The default covers
            2 s of a 1 Gbit/s link.
        idle_s: streams idle this long are dropped, seconds.
        clock: monotonic seconds (tests pass a fake).

    Raises:
        TypeError: the cache's policy is not a :class:`HintedPolicy`.
    """

    def __init__(
        self,
        cache: BlockCache,
        scheduler: FetchScheduler,
        window_bytes: int = 256 << 20,
        idle_s: float = IDLE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not isinstance(cache.policy, HintedPolicy):
            raise TypeError("hints need the cache's policy to be a HintedPolicy")
        self.policy: HintedPolicy = cache.policy
        self.cache = cache
        self.scheduler = scheduler
        self.window_bytes = max(0, min(window_bytes, cache.capacity_bytes // 2))
        self.idle_s = idle_s
        self._clock = clock
        self._far_planned = -FAR_PLAN_S  # when a plan last looked past the window
        self._active: dict[str, float] = {}  # stream -> last post or counted read
        self._smallest = 1 << 62  # smallest hinted block, bytes
        self._sources: dict[str, list[str]] = {}  # stream -> snapshots its plan reads
        self._posting = asyncio.Lock()  # one post builds at a time (the caps hold)

    # -- streams ---------------------------------------------------------------------------

    def room(
        self, stream: str, append: bool = False, share: HintShare | None = None
    ) -> CappedBuilder:
        """A builder for stream ``stream``'s next post that stops at the first cap it
        would pass (so a worker thread never builds what :meth:`install` refuses); with a
        ``share``, at the token's share and the operator's reserve too.

        Raises:
            OverLimit: the post is refused whatever it holds (too many streams or posts).
        """
        self.expire()
        current = self.policy.stream(stream)
        if current is None and len(self.policy.streams) >= MAX_STREAMS:
            raise OverLimit(
                f"{MAX_STREAMS} hint streams are installed already; delete one "
                f"(DELETE /v1/hints/{{stream}}) or reuse a stream name",
                "streams",
                MAX_STREAMS,
            )
        kept = current if append else None
        if kept is not None and kept.plans >= MAX_STREAM_PLANS:
            raise OverLimit(
                f"stream {stream!r} keeps {MAX_STREAM_PLANS} posts not yet read; "
                "post the rest once reads have caught up (or replace the stream)",
                "stream_plans",
                MAX_STREAM_PLANS,
            )
        others = [s for name, s in self.policy.streams.items() if name != stream]
        kept_held = (len(kept), kept.distinct_blocks()) if kept else (0, 0)
        total = held(others, kept_held)
        positions = [
            Cap(
                "stream_positions",
                MAX_STREAM_POSITIONS,
                kept.remaining if kept else 0,
                "the stream",
            ),
            Cap("total_positions", MAX_TOTAL_POSITIONS, total[0], "the hint streams together"),
        ]
        blocks = [
            Cap("total_blocks", MAX_TOTAL_BLOCKS, total[1], "the hint streams together"),
        ]
        if share is not None:  # kept is the token's: the route refuses another's stream
            mine = held([s for s in others if share.owns(self.source(s.name))], kept_held)
            positions += shared_caps(share, "positions", MAX_TOTAL_POSITIONS, mine[0], total[0])
            blocks += shared_caps(share, "blocks", MAX_TOTAL_BLOCKS, mine[1], total[1])
        return CappedBuilder(
            min(positions, key=lambda cap: cap.room), min(blocks, key=lambda cap: cap.room)
        )

    def held(self, owns: Callable[[str], bool] | None = None) -> tuple[int, int]:
        """Planned reads and distinct blocks (summed per stream) the installed streams hold
        (``owns``: only those whose source it accepts, as :attr:`HintShare.owns`), idle
        ones dropped first."""
        self.expire()
        streams = self.policy.streams.values()
        return held([s for s in streams if owns is None or owns(self.source(s.name))])

    def source(self, stream: str) -> str:
        """What stream ``stream``'s plan reads: ``DATASET@VERSION, ...`` ('' if unknown)."""
        return ", ".join(x for x in self._sources.get(stream, []) if x)

    def install(
        self,
        stream: str,
        blocks: Sequence[tuple[str, int]] | HintPlan,
        append: bool = False,
        source: str = "",
        share: HintShare | None = None,
    ) -> tuple[HintStatus, int]:
        """Make ``blocks`` (``(digest, size)`` in read order, or a plan built with
        :meth:`room`) stream ``stream``'s plan (``append``: extend it; a stream that does
        not exist yet is started) and start prefetching. ``source`` says what the blocks
        are of (e.g. ``f3@v1``), for :meth:`status`; ``share``: a scoped token posts
        (see :meth:`room`).

        Returns:
            The stream's status and how many prefetches started.

        Raises:
            OverLimit: too many streams or posts, the stream would grow too long, all
                streams together would hold too many planned reads or blocks, or a
                scoped token's streams more than its share of them.
        """
        builder = self.room(stream, append, share)
        if not isinstance(blocks, HintPlan):
            blocks = HintPlan.of((d for d, _ in blocks), (size for _, size in blocks))
        plan = blocks
        current = self.policy.stream(stream)
        kept = current.remaining if append and current is not None else 0
        if kept + len(plan) > MAX_STREAM_POSITIONS:
            raise OverLimit(
                f"stream {stream!r} would hold {kept + len(plan):,} planned reads; "
                f"at most {MAX_STREAM_POSITIONS:,} are kept",
                "stream_positions",
                MAX_STREAM_POSITIONS,
            )
        builder.check(len(plan), len(plan.keys))
        self._smallest = min(self._smallest, max(1, plan.smallest))
        installed = self.policy.set_hint(plan, append=append, stream=stream)
        self._active[stream] = self._clock()
        sources = self._sources.get(stream, []) if append and current is not None else []
        self._sources[stream] = sources if source in sources else [*sources, source]
        assert installed is not None
        log.info(
            "hint stream %s: %d blocks %s, %d planned reads ahead",
            stream,
            len(plan),
            "appended" if append else "installed",
            installed.remaining,
        )
        return self._status(installed), self.prefetch_ahead()

    async def post(
        self,
        stream: str,
        build: Callable[[PlanBuilder], HintPlan],
        append: bool = False,
        source: str = "",
        share: HintShare | None = None,
        admit: Callable[[], None] | None = None,
    ) -> tuple[HintStatus, int]:
        """:meth:`install` a plan that ``build`` makes in a worker thread (it gets the
        :meth:`room` builder; parsing and building never run on the event loop). One
        post at a time, so the caps checked before the build still hold after it; the
        caller's own check ``admit`` (a tenant's stream count) runs first under the same
        lock, so concurrent posts cannot all pass it at once.

        Raises:
            OverLimit: as :meth:`install`, or ``build`` passed a cap.
            Exception: whatever ``build`` or ``admit`` raises (e.g. InvalidRequest for a
                bad path).
        """
        async with self._posting:
            if admit is not None:
                admit()
            builder = self.room(stream, append, share)
            try:
                plan = await asyncio.to_thread(build, builder)
            except PlanLimit as err:
                raise OverLimit(str(err), err.limit, err.value) from None
            return self.install(stream, plan, append=append, source=source, share=share)

    def remove(self, stream: str) -> bool:
        """Drop a stream; returns whether it was installed."""
        removed = self.policy.clear_hint(stream)
        self._active.pop(stream, None)
        self._sources.pop(stream, None)
        return removed

    def status(self) -> list[HintStatus]:
        """Every installed stream, by name."""
        self.expire()
        return [self._status(s) for _, s in sorted(self.policy.streams.items())]

    def expire(self) -> list[str]:
        """Drop streams idle for ``idle_s`` seconds; returns their names."""
        now = self._clock()
        idle = [
            name for name in self.policy.streams if now - self._active.get(name, now) >= self.idle_s
        ]
        for name in idle:
            log.info("hint stream %s idle for %.0f s: dropped", name, self.idle_s)
            self.remove(name)
        return idle

    def _status(self, s: HintStream) -> HintStatus:
        idle = self._clock() - self._active.get(s.name, self._clock())
        return HintStatus(s.name, self.source(s.name), len(s), s.cursor, s.remaining, idle)

    # -- reads -----------------------------------------------------------------------------

    def observe(self, digests: Iterable[str], hit: bool = True) -> None:
        """The mount read these blocks (an access-log subscriber; hit or miss alike):
        move cursors and top up the prefetch window."""
        if not self.policy.active:
            return
        moved = False
        now = self._clock()
        for digest in digests:
            stream = self.policy.observe(digest)
            if stream is not None:
                self._active[stream.name] = now
                moved = True
        if moved:
            self.prefetch_ahead()

    def hold(self, digests: Sequence[str]) -> None:
        """A reader waits for these blocks (see :meth:`HintedPolicy.hold`)."""
        self.policy.hold(digests)

    def release(self, digests: Sequence[str]) -> None:
        """The reader has them."""
        self.policy.release(digests)

    # -- prefetch --------------------------------------------------------------------------

    def plan(self) -> list[tuple[str, int]]:
        """The planned blocks to fetch now, soonest first (see the module docstring):
        :meth:`plan_parts`' window, then the rest it takes into free room."""
        near, far = self.plan_parts()
        return near + far

    def plan_parts(self) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        """The planned blocks to fetch now, soonest first, in two parts.

        * **Near**: the blocks of the next ``window_bytes`` of planned reads not yet
          cached or on their way, each into free room or in place of a block whose next
          planned read is later.
        * **Far**: once every near block is taken, the planned blocks after the window,
          in plan order, into free room only (never in place of a block) and only as far
          as a window's worth of room stays free after them (for the next window, another
          stream's or a reader's misses), so the link stays busy with the rest of the plan
          while the cache has room to spare. A cache filling in plan order holds what
          Belady's MIN holds at its first eviction, so while the plan is what is read this
          fetches nothing MIN would not; a far block evicted unread shrinks the hint's
          ledger window like any other.
        """
        window: list[tuple[float, str, int]] = []
        beyond: list[tuple[str, int]] = []
        free = self.cache.free_bytes - self.scheduler.on_the_way_bytes
        total = beyond_bytes = 0
        past = False
        # enough positions per stream to fill the window and the free room, within reason
        # (each plan runs on every reported read; a full cache looks at the window only,
        # and past the window a plan looks at most every FAR_PLAN_S)
        now = self._clock()
        far_due = now - self._far_planned >= FAR_PLAN_S
        if far_due:
            self._far_planned = now
        reach = self.window_bytes + (max(0, free) if far_due else 0)
        count = min(MAX_LOOKAHEAD, max(16, reach // max(1, self._smallest)))
        for when, digest, size in self.policy.upcoming_blocks(count):
            past = past or total + size > self.window_bytes
            if not past:
                total += size
            if self.cache.contains(digest) or self.scheduler.is_fetching(digest):
                continue
            if not past:
                window.append((when, digest, size))
                continue
            beyond_bytes += size
            if beyond_bytes > free:
                break
            beyond.append((digest, size))
        room = free
        want = sum(size for _, _, size in window) - room
        victims = iter(self.policy.victims(want) if want > 0 else [])
        victim = next(victims, None)
        chosen: list[tuple[str, int]] = []
        for when, digest, size in window:
            while room < size and victim is not None and victim.next_use > when:
                room += victim.size
                victim = next(victims, None)
            if room < size:
                return chosen, []  # the near blocks come first: nothing beyond them yet
            room -= size
            chosen.append((digest, size))
        free -= sum(size for _, size in chosen) + self.window_bytes
        far: list[tuple[str, int]] = []
        for digest, size in beyond:
            if size > free:
                break
            free -= size
            far.append((digest, size))
        return chosen, far

    def prefetch_ahead(self) -> int:
        """Start fetching :meth:`plan_parts`: the near blocks as hinted prefetches, the far
        ones behind every other class (:attr:`Priority.FILL`: background fill waits while a
        hint is installed); both are the hint's in the prefetch ledger. Returns how many
        fetches started."""
        near, far = self.plan_parts()
        started = self.scheduler.prefetch(near, Priority.HINT) if near else 0
        if far:
            started += self.scheduler.prefetch(far, Priority.FILL, Source.HINT)
        return started
