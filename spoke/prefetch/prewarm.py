"""Prewarm jobs: fetch a snapshot's files (or some of them) into the cache before a job runs.

A job resolves its ref once, selects files with globs, and fetches their distinct blocks
with several ReadBlocks batches in flight at once (enough to fill a high-latency link),
reporting bytes done and total, rate and ETA. With ``pin`` the blocks are pinned first, and
a job whose blocks cannot fit next to what is already pinned fails before fetching anything,
so pinned data is never evicted for it. Without ``pin`` a job that asks for more than the
cache holds finishes and says how many of its bytes stayed cached.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Literal

from protocol.hub.v1 import hub_pb2
from spoke.cache.blockcache import BlockCache
from spoke.catalog.catalog import SnapshotCatalog
from spoke.catalog.selection import (
    MATCH_BUDGET_S,
    GlobMatcher,
    describe,
    preview,
    select,
    unique_blocks,
    validate_globs,
)
from spoke.errors import InvalidRequest, SpokeError
from spoke.fetch.priority import Priority
from spoke.fetch.scheduler import FetchScheduler
from spoke.upkeep.pins import PinRegistry

log = logging.getLogger(__name__)

State = Literal["running", "done", "failed", "cancelled"]
BATCH_BLOCKS = 16  # most blocks per fetch batch (one ReadBlocks stream)
BATCH_BYTES = 32 << 20  # most bytes per fetch batch
PARALLEL_BATCHES = 32  # batches waiting per job; the scheduler sends a window of them
KEEP_FINISHED = 100
"""Finished jobs remembered per dataset (newest first), so one team's many jobs cannot push
another team's out of the history (issue 39's seventh probe: 300 jobs of one scoped token
left another's lookup 404)."""
KEEP_FINISHED_TOTAL = 1000
"""Finished jobs remembered in all (a finished job keeps its counts, not its block list)."""
SELECTIONS = 2
"""Selections (a manifest decoded, then globs matched against it) running at once, each in
a worker thread and at most one per caller (:class:`SelectionSlots`), so the event loop
keeps at least a third of the interpreter while they run; with :data:`LIGHT_SELECTIONS`,
at most three decoded manifests are held for them."""

LIGHT_SELECTIONS = 1
"""Selections beyond :data:`SELECTIONS` only a light caller may start (:class:`SelectionSlots`):
a manifest's decode is not bounded by the match budget (2.4 s for 400,000 files)."""

LIGHT_USE_S = 1.0
"""Most seconds of slots (decayed, :data:`USE_HALF_LIFE_S`) a light caller has held: a small
selection a second holds about 0.7; one heavy selection two to four."""

LIGHT_ENTRIES = 20_000
"""Most manifest entries (``Snapshot.entry_count``, known before the decode) of a selection
that may take a light slot: decoded and matched in about 0.1 s (400,000 take 2.4 s). Light
callers alone let several tokens taking turns (each light again after a rest) keep the
light slot decoding large manifests (the fourteenth probe: eight rotating tokens, a light
team's one-file prewarm waited up to 10.2 s)."""


@dataclass
class Job:
    """One prewarm job (the admin API's view of it is :meth:`public`)."""

    id: str
    dataset: str
    ref: str
    version: str
    paths: list[str]
    pin: bool
    files: int
    blocks: dict[str, int] = field(repr=False)
    bytes_total: int = 0
    bytes_done: int = 0
    state: State = "running"
    error: str = ""
    message: str = ""
    pin_id: str = ""
    cached_bytes: int = 0
    started: float = field(default_factory=time.time)
    finished: float | None = None
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    block_count: int = 0
    paths_total: int = 0

    def __post_init__(self) -> None:
        self.block_count = len(self.blocks)
        # the first globs only (1,000 remembered jobs of 64 KiB of globs held 64 MiB)
        self.paths_total = len(self.paths)
        self.paths = preview(self.paths)

    def public(self) -> dict[str, object]:
        """State, progress (bytes), rate (bytes/s) and ETA (s) of the job."""
        elapsed = (self.finished or time.time()) - self.started
        rate = self.bytes_done / elapsed if elapsed > 0 else 0.0
        left = self.bytes_total - self.bytes_done
        return {
            "id": self.id,
            "dataset": self.dataset,
            "ref": self.ref,
            "version": self.version,
            "paths": self.paths,
            "paths_total": self.paths_total,
            "pin": self.pin,
            "pin_id": self.pin_id or None,
            "state": self.state,
            "files": self.files,
            "blocks": self.block_count,
            "bytes_total": self.bytes_total,
            "bytes_done": self.bytes_done,
            "cached_bytes": self.cached_bytes,
            "rate_bytes_per_s": rate,
            "eta_s": (left / rate if rate > 0 else None) if self.state == "running" else 0.0,
            "elapsed_s": elapsed,
            "error": self.error or None,
            "message": self.message or None,
        }


def fetch_batches(
    blocks: list[tuple[str, int]],
    most_blocks: int | None = BATCH_BLOCKS,
    most_bytes: int = BATCH_BYTES,
) -> list[list[tuple[str, int]]]:
    """Split ``(digest, size)`` pairs, in order, into batches of at most ``most_blocks``
    blocks (None: any number) and ``most_bytes`` bytes (a block larger than that is a batch
    of its own). Prewarm jobs and the background fill batch this way.

    With :data:`PARALLEL_BATCHES` batches waiting a job keeps 32 MiB (64 KiB blocks)
    to 1 GiB (4 MiB blocks) queued at the scheduler, several times the window it puts on
    the wire (the bandwidth-delay product of 1 Gbit/s at 50 ms is 6.25 MB), so the
    window never runs dry while a batch completes.
    """
    batches: list[list[tuple[str, int]]] = []
    batch: list[tuple[str, int]] = []
    size = 0
    for digest, nbytes in blocks:
        full = most_blocks is not None and len(batch) >= most_blocks
        if batch and (full or size + nbytes > most_bytes):
            batches.append(batch)
            batch, size = [], 0
        batch.append((digest, nbytes))
        size += nbytes
    if batch:
        batches.append(batch)
    return batches


USE_HALF_LIFE_S = 10.0
"""Half-life of the seconds a caller held selection slots, for :class:`SelectionSlots`."""


class CapacityError(SpokeError):
    """A pinned prewarm cannot fit next to what is already pinned."""


class PrewarmJobs:
    """Runs and tracks prewarm jobs on the daemon's event loop."""

    def __init__(
        self,
        catalog: SnapshotCatalog,
        cache: BlockCache,
        scheduler: FetchScheduler,
        pins: PinRegistry,
    ) -> None:
        self._catalog = catalog
        self._cache = cache
        self._scheduler = scheduler
        self._pins = pins
        self._jobs: dict[str, Job] = {}
        self._selecting = SelectionSlots(SELECTIONS, LIGHT_SELECTIONS)

    async def start(
        self,
        dataset: str,
        ref: str,
        paths: list[str],
        pin: bool,
        admit: Callable[[int], None] | None = None,
        caller: str = "",
    ) -> Job:
        """Validate, resolve and start a job; ``admit`` (the caller's room check) runs again
        after the resolve, given the number of blocks the job pins (0 without ``pin``), with
        no await between it and the job's start, so concurrent requests cannot all pass it
        while none is counted yet. ``caller`` names who asks
        (a scoped admin token; ``""`` the node-wide one), as in :meth:`resolve`.

        Raises:
            Exception: whatever ``admit`` raises (the admin API's LimitReached).
            InvalidRequest: bad globs, or globs that match no file.
            NotFound: unknown dataset or ref.
            HubUnavailable: the snapshot is not known here and the hub is unreachable.
            CapacityError: ``pin`` and the blocks cannot fit beside existing pins.
        """
        snapshot, globs, entries, blocks = await self.resolve(dataset, ref, paths, caller)
        if admit is not None:
            admit(len(blocks) if pin else 0)
        total = sum(blocks.values())
        if pin:
            self.check_pin_room(f"{dataset}@{ref}", blocks, dataset)
        job = Job(
            secrets.token_hex(8),
            dataset,
            ref,
            snapshot.version,
            globs,
            pin,
            len(entries),
            blocks,
            bytes_total=total,
        )
        if pin:
            job.pin_id = self._pins.add(dataset, ref, snapshot.version, globs, blocks).id
        job.task = asyncio.create_task(self._run(job))
        self._jobs[job.id] = job
        self._forget_old()
        return job

    def selection(
        self, caller: str, snapshot: hub_pb2.Snapshot
    ) -> contextlib.AbstractAsyncContextManager[None]:
        """One of the spoke's selection slots, for ``caller`` to decode ``snapshot``'s
        manifest (the hint route decodes and plans a manifest in one too); a light slot
        only for a manifest of at most :data:`LIGHT_ENTRIES` entries."""
        return self._selecting.slot(caller, small=snapshot.entry_count <= LIGHT_ENTRIES)

    async def resolve(
        self, dataset: str, ref: str, paths: list[str], caller: str = ""
    ) -> tuple[hub_pb2.Snapshot, list[str], list[hub_pb2.ManifestEntry], dict[str, int]]:
        """The snapshot, validated globs, selected files and their distinct blocks. The
        manifest is decoded and matched in a :class:`SelectionSlots` slot of ``caller``'s
        (one at a time per caller, :data:`SELECTIONS` in all), in worker threads, within
        :data:`~spoke.catalog.selection.MATCH_BUDGET_S`.

        Raises:
            InvalidRequest: bad globs, globs that match no file, or too much matching.
            NotFound, HubUnavailable: as :meth:`SnapshotCatalog.resolve_ref`.
        """
        globs = validate_globs(paths)
        matcher = GlobMatcher(globs)
        snapshot = await self._catalog.resolve_ref(dataset, ref)
        what = f"{dataset}@{ref}"
        async with self.selection(caller, snapshot):  # CPU and memory: off the loop, few
            manifest = await self._catalog.manifest(dataset, snapshot.version)
            matcher.check_work(len(manifest), what)
            entries, blocks = await asyncio.to_thread(_select_blocks, manifest, matcher, what)
            del manifest
        if not entries:
            raise InvalidRequest(f"no file of {dataset}@{ref} matches {describe(globs)}")
        return snapshot, globs, entries, blocks

    def check_pin_room(self, what: str, blocks: dict[str, int], dataset: str = "") -> None:
        """Refuse a pin that cannot fit beside the pins already held — and, with tenants'
        shares (:mod:`spoke.cache.tenants`), one that would let ``dataset``'s tenant pin
        more than the cache less every other tenant's share (datasets no tenant names:
        less every tenant's share, together): pinned blocks are never evicted, so that is
        how far one team's pins may go without keeping another below its share.

        Raises:
            CapacityError: the not-yet-pinned bytes exceed the cache's unpinned room, or
                the tenant's room for pins.
        """
        cache = self._cache
        room = cache.capacity_bytes - cache.pinned_bytes
        new = sum(s for d, s in blocks.items() if not cache.is_pinned(d))
        if new > room:
            raise CapacityError(
                f"cannot pin {new:,} bytes of {what}: only {room:,} of the cache's "
                f"{cache.capacity_bytes:,} bytes are not pinned already"
            )
        tenants = cache.tenants
        if tenants is None:
            return
        # a dataset no tenant names (None) may pin what no tenant's share holds: pins of
        # such datasets squeezed every tenant's reads once they passed it (the seventeenth
        # probe: 78 MiB of pins on a 64 MiB cache through a token wider than its tenant)
        tenant = tenants.tenant_of_datasets([dataset])
        others = sum(tenants.share_bytes(t) for t in tenants.tenants() if t != tenant)
        allowed = cache.capacity_bytes - others
        # the tenant's pins as recorded, fetched or not: pins whose blocks are still on
        # their way hold their room as much as resident ones (a probe pinned 48 MiB of a
        # 32 MiB allowance in two requests before anything arrived)
        held = sum(
            p.bytes for p in self._pins.all() if tenants.tenant_of_datasets([p.dataset]) == tenant
        )
        new = sum(blocks.values())
        if held + new > allowed:
            whose = f"tenant {tenant}" if tenant else "datasets no tenant names"
            raise CapacityError(
                f"cannot pin {new:,} bytes of {what}: {whose} hold {held:,} pinned "
                f"bytes and may pin at most {allowed:,} (the cache less the tenants' "
                f"shares but their own, --tenants)"
            )

    def get(self, job_id: str) -> Job | None:
        """A job by id."""
        return self._jobs.get(job_id)

    def all(self) -> list[Job]:
        """Every remembered job, newest first."""
        return sorted(self._jobs.values(), key=lambda j: j.started, reverse=True)

    async def cancel(self, job_id: str) -> Job | None:
        """Cancel a running job (its pin, if any, stays); None for an unknown id."""
        job = self._jobs.get(job_id)
        if job is None:
            return None
        if job.task is not None and not job.task.done():
            job.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await job.task
        return job

    async def close(self) -> None:
        """Cancel every running job."""
        for job in list(self._jobs.values()):
            await self.cancel(job.id)

    async def _run(self, job: Job) -> None:
        batches = fetch_batches(list(job.blocks.items()))
        queue: asyncio.Queue[list[tuple[str, int]]] = asyncio.Queue()
        for batch in batches:
            queue.put_nowait(batch)

        async def worker() -> None:
            while not queue.empty():
                batch = queue.get_nowait()
                await self._scheduler.ensure(batch, Priority.PREWARM)
                job.bytes_done += sum(size for _, size in batch)

        try:
            await asyncio.gather(*(worker() for _ in range(min(PARALLEL_BATCHES, len(batches)))))
            job.state = "done"
        except asyncio.CancelledError:
            job.state = "cancelled"
            raise
        except SpokeError as err:
            job.state, job.error = "failed", str(err)
        except Exception as err:
            log.exception("prewarm job %s failed", job.id)
            job.state, job.error = "failed", f"{type(err).__name__}: {err}"
        finally:
            job.finished = time.time()
            job.cached_bytes = sum(s for d, s in job.blocks.items() if self._cache.contains(d))
            job.blocks = {}  # a finished job is remembered by its counts
            if job.state == "done" and job.cached_bytes < job.bytes_total:
                job.message = (
                    f"{job.cached_bytes:,} of {job.bytes_total:,} bytes stayed cached: the "
                    f"selection is larger than the cache ({self._cache.capacity_bytes:,} bytes)"
                )
            log.info(
                "prewarm %s %s: %d/%d bytes", job.id, job.state, job.bytes_done, job.bytes_total
            )

    def _forget_old(self) -> None:
        kept: collections.Counter[str] = collections.Counter()
        for job in [j for j in self.all() if j.state != "running"]:  # newest first
            kept[job.dataset] += 1
            if kept[job.dataset] > KEEP_FINISHED or kept.total() > KEEP_FINISHED_TOTAL:
                self._jobs.pop(job.id, None)
                kept[job.dataset] -= 1


def _select_blocks(
    manifest: list[hub_pb2.ManifestEntry], matcher: GlobMatcher, what: str
) -> tuple[list[hub_pb2.ManifestEntry], dict[str, int]]:
    """The files ``matcher`` selects and their distinct blocks (in a worker thread).

    Raises:
        InvalidRequest: matching took more than :data:`MATCH_BUDGET_S`.
    """
    entries = select(manifest, matcher, MATCH_BUDGET_S, what)
    return entries, unique_blocks(entries)


class SelectionSlots:
    """At most ``slots`` selections at once and one per caller; a freed slot goes to the
    waiting caller that has held slots least lately — seconds held, halved every
    :data:`USE_HALF_LIFE_S` (the rule of the hub's page-build turns, :mod:`hub.limits.turns`,
    after Linux CFS) — so a light caller's next request does not queue behind heavy ones
    (the eleventh probe: one token's two requests held both slots and another team's
    one-file prewarm waited 98 s; the twelfth: five colluding tokens made it wait 20 s in
    arrival order, and 11.6 s with the least-lately-*served* rule, since the light team's
    own last request counted as recent).

    A light caller (less than :data:`LIGHT_USE_S` held, decayed) with a small selection (a
    manifest of at most :data:`LIGHT_ENTRIES` entries) may also take one of ``light``
    further slots, which no other may: its request does not wait for a heavy selection's
    decode and match to end (the thirteenth probe), nor for a large one that several
    tokens taking turns, each light again after a rest, would run there (the fourteenth).

    Args:
        slots: selections at once, for any caller.
        light: further selections at once, for light callers only.
    """

    def __init__(self, slots: int, light: int = 0) -> None:
        self._slots = slots
        self._light = light
        self._holders: dict[str, float] = {}  # caller → monotonic time it took its slot
        self._waiting: list[tuple[str, bool, asyncio.Future[None]]] = []  # who, small, turn
        self._used: dict[str, tuple[float, float]] = {}  # caller → (seconds held, as of)

    def used(self, caller: str, now: float) -> float:
        """Seconds of slots ``caller`` held, each halved every :data:`USE_HALF_LIFE_S`."""
        held, since = self._used.get(caller, (0.0, now))
        decay: float = 0.5 ** ((now - since) / USE_HALF_LIFE_S)
        return held * decay

    @contextlib.asynccontextmanager
    async def slot(self, caller: str, small: bool = True) -> AsyncIterator[None]:
        """Hold a slot of ``caller``'s while the block runs (``small``: a selection that
        may take a light slot)."""
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((caller, small, turn))
        self._hand_on()
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():  # handed the slot as it went
                self._release(caller)
            else:
                self._waiting = [w for w in self._waiting if w[2] is not turn]
            raise
        try:
            yield
        finally:
            self._release(caller)

    def _release(self, caller: str) -> None:
        now = time.monotonic()
        took = self._holders.pop(caller, now)
        self._used[caller] = (self.used(caller, now) + (now - took), now)
        self._hand_on()

    def _hand_on(self) -> None:
        """Free slots to the waiting callers that held slots least lately (not holding);
        the light slots to light callers' small selections only."""
        now = time.monotonic()
        while len(self._holders) < self._slots + self._light:
            light_only = len(self._holders) >= self._slots
            waiting = [
                (self.used(who, now), small, n)
                for n, (who, small, turn) in enumerate(self._waiting)
                if who not in self._holders and not turn.done()
            ]
            eligible = [
                (used, n)
                for used, small, n in waiting
                if not light_only or (small and used < LIGHT_USE_S)
            ]
            if not eligible:
                self._waiting = [w for w in self._waiting if not w[2].done()]
                return
            _, n = min(eligible)
            who, _, turn = self._waiting.pop(n)
            self._holders[who] = now
            turn.set_result(None)
