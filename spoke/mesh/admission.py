"""What the owner lets a peer's call ask for, decided before anything is queued.

- **Scope** (:class:`ScopeCheck`): a block is served only if it is in a live snapshot this
  spoke stores (its own catalog, :mod:`spoke.catalog.blockscope`) of a dataset the caller's grant
  covers; its size is the one in this spoke's manifests, whatever the caller wrote. The
  snapshots a caller names are a hint: one this spoke has not stored yet, of a dataset
  the grant covers, is loaded first through this spoke's own catalog (its own token,
  resolved at its hub, manifest checked against the snapshot id, signatures if
  configured), so an owner that never read the caller's snapshot can still serve it
  (the region's one copy of each block) without trusting the caller's word. Loads cost
  hub calls, so each caller starts at most
  :data:`HINT_LOADS_BURST` at once and :data:`HINT_LOADS_PER_S` on average (a token
  bucket), and a name that failed to load is not tried again for :data:`HINT_RETRY_S`
  whoever names it (at most :data:`MAX_FAILED` remembered: when full, nothing new is
  loaded until entries expire, so no caller can flush what it made fail).
- **Who the caller is** (:func:`~spoke.mesh.grantcheck.caller_of`): the subject the hub
  signed into its grant (the token's name), never the grant's holder key nor its node
  name: the caller picks both when it asks the hub for a grant, so keying anything by
  them would let one token multiply its allowance by minting grants. Every allowance
  here is per subject: the spokes of a region sharing one hub token share it at each
  owner.
- **Limits** (:class:`CallerLimits`): per caller at most :data:`CALLS_PER_CALLER` calls
  and :data:`BYTES_PER_CALLER` bytes asked for in flight; beyond, RESOURCE_EXHAUSTED, and
  the caller asks the hub.
- **Memory** (:class:`MemoryBudget`): what the peer port holds for callers, all of them
  together, is at most :data:`MEMORY_BUDGET` bytes, and one caller holds at most half of
  it (its fair share once more than half is held); a call that would pass it is refused
  (RESOURCE_EXHAUSTED, reason ``memory``) before anything is queued.
- **Refusals** (:class:`Refusals`): every refused call, and every call with blocks
  declined, is counted (``strata_spoke_peer_refusals_total{reason}``), written to the
  audit log as a refusal (rate-limited there, the rest counted in a summary record by
  reason), and logged (at most one line per reason every :data:`LOG_EVERY_S`). Declined
  blocks are one reason, ``declined``, in the metrics and the log, whether this spoke
  holds no such block or holds it only for other datasets: anyone who reads ``/metrics``
  could otherwise tell whether another tenant's spoke holds a digest they guessed. Only
  the owner-only audit log says which (``unknown``, ``outside``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from protocol.grants import covers
from protocol.spoke.v1 import peer_pb2
from spoke.audit import AuditLog
from spoke.catalog.catalog import SnapshotCatalog
from spoke.disk.layout import is_digest
from spoke.errors import SpokeError
from spoke.mesh import metrics
from strata_local.audit import TokenBucket

log = logging.getLogger(__name__)

CALLS_PER_CALLER = 32
"""Most calls one caller (subject) may have in flight at this owner. A spoke's scheduler
opens at most 16 streams, split over every owner of the region: ``N`` spokes sharing one
token keep about 16 in flight at each owner of ``N``, so this leaves room for twice that."""

BYTES_PER_CALLER = 512 << 20
"""Most bytes of blocks one caller may have asked of this owner and not received: twice
what a spoke's scheduler puts on the wire at most (its 256 MiB link window and 8 demand
streams of 16 MiB). What this bounds is work queued here (hub fetches on the caller's
behalf go through this spoke's own link window); memory is :data:`MEMORY_BUDGET`'s."""

MEMORY_BUDGET = 256 << 20
"""Most bytes the peer port holds for callers, all of them together (blocks sent from
memory, the chunk each call has on its way out and gRPC's copies of it). Sized for the
DaemonSet's 1 GiB memory limit (``deploy/k8s/base/spoke/daemonset.yaml``):

- the daemon at rest, catalog and index maps: about 130 MiB;
- the scheduler's link window, the block bytes of hub fetches in flight: 256 MiB at most
  (:mod:`spoke.fetch.window`), whoever asked for them, a peer included;
- this budget: 256 MiB;
- the rest, about 380 MiB, for the mount's and hint streams' work and allocator slack.

So stalled peers, however many and with however many grants, leave a daemon at about
130 + 256 = 390 MiB, under the 512 MiB the issue 23 probe holds it to, and with the link
window full besides, under 650 MiB of the 1 GiB. A call is charged
:data:`CALL_HOLD_BYTES` (``spoke.mesh.peerservice``) when it is admitted, and a block it
is sent from memory (one the cache could not take) its size while it is sent."""

MAX_HINTS = 8
"""Most snapshots a request may name."""

HINT_WAIT_S = 1.0
"""Longest a call waits for the manifests it names to load, seconds (half the default
``--peer-timeout``: a caller must not take a slow first load for a dead peer); blocks
still unknown then are declined, and the load goes on for later calls."""

HINT_RETRY_S = 30.0
"""How long a named snapshot that could not be loaded is not tried again, seconds."""

HINT_LOADS_BURST = MAX_HINTS
"""Most snapshot loads one caller may start at once (one request's worth)."""

HINT_LOADS_PER_S = 0.25
"""Snapshot loads one caller may start per second on average beyond the burst (a region
reads a few snapshots; each is loaded once)."""

CALLERS_TRACKED = 1024
"""Callers whose load allowance is remembered (least recently seen forgotten first)."""

MAX_FAILED = 1024
"""Most failed names remembered; when full, nothing new is loaded until some expire."""

MAX_NAME_CHARS = 128
"""Longest dataset or version name in a hint that is looked at."""

LOG_EVERY_S = 10.0
"""Least time between two log lines for refusals of one reason, seconds."""


@dataclass
class Decision:
    """What may be served of one request: ``allowed`` ``(digest, size)`` in request order,
    the digests declined because no live snapshot stored here holds them (``unknown``) or
    none the grant covers does (``outside``), and those the caller may have but is sent
    to its relay for (``relayed``: hot, :mod:`spoke.mesh.relay`)."""

    allowed: list[tuple[str, int]] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)
    relayed: list[str] = field(default_factory=list)

    @property
    def declined(self) -> list[str]:
        """Every declined digest."""
        return self.unknown + self.outside

    @property
    def nbytes(self) -> int:
        """Bytes of the blocks allowed."""
        return sum(size for _, size in self.allowed)


class ScopeCheck:
    """Decides a request's blocks against this spoke's catalog and the caller's grant.

    Args:
        catalog: this spoke's catalog (its block scope index, and manifests to load).
        now: the monotonic clock.
    """

    def __init__(self, catalog: SnapshotCatalog, now: Callable[[], float] = time.monotonic) -> None:
        self.catalog = catalog
        self._now = now
        self._loading: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._failed: dict[tuple[str, str], float] = {}  # (dataset, version) -> retry after
        self._allowance: OrderedDict[str, TokenBucket] = OrderedDict()

    def _may_load(self, caller: str) -> bool:
        """Whether ``caller`` may start one more load now (takes it from its allowance)."""
        bucket = self._allowance.pop(caller, None)
        if bucket is None:
            bucket = TokenBucket(HINT_LOADS_PER_S, HINT_LOADS_BURST, self._now)
        self._allowance[caller] = bucket  # most recently seen last
        while len(self._allowance) > CALLERS_TRACKED:
            self._allowance.popitem(last=False)
        return len(self._failed) < MAX_FAILED and bucket.take()

    async def load(
        self, hints: Sequence[peer_pb2.SnapshotRef], scopes: Sequence[str], caller: str = ""
    ) -> None:
        """Load (once, however many callers name them) the manifests of named snapshots
        this spoke has not stored as those versions, of datasets the grant covers, waiting
        at most :data:`HINT_WAIT_S`; ``caller`` (a grant's subject) starts loads within
        its allowance, and failures are remembered for :data:`HINT_RETRY_S`."""
        now = self._now()
        self._failed = {k: t for k, t in self._failed.items() if t > now}
        waits = []
        for hint in hints[:MAX_HINTS]:
            name = (hint.dataset, hint.version)
            if (
                not is_digest(hint.snapshot_id)
                or not _name(hint.dataset)
                or not _name(hint.version)
                or not covers(scopes, hint.dataset)
                or name in self.catalog.scope.names(hint.snapshot_id)
                or name in self._failed
            ):
                continue
            task = self._loading.get(name)
            if task is None:
                if not self._may_load(caller):
                    continue  # its blocks stay unknown here: declined, read from the hub
                task = asyncio.create_task(self._load(*name, hint.snapshot_id))
                self._loading[name] = task
                task.add_done_callback(functools.partial(self._loaded, name))
            waits.append(task)
        if waits:  # a long manifest keeps loading for the next caller; this one goes on
            await asyncio.wait([asyncio.shield(t) for t in waits], timeout=HINT_WAIT_S)

    def _loaded(self, name: tuple[str, str], task: asyncio.Task[None]) -> None:
        self._loading.pop(name, None)

    async def _load(self, dataset: str, version: str, snapshot_id: str) -> None:
        try:
            await self.catalog.manifest(dataset, version, stale_ok=True)
        except SpokeError as err:
            log.info("snapshot %s@%s a peer named: %s", dataset, version, err)
            self._failed[(dataset, version)] = self._now() + HINT_RETRY_S
            return
        if (dataset, version) not in self.catalog.scope.names(snapshot_id):
            # stored, as another snapshot than named: naming it again asks nothing new
            self._failed[(dataset, version)] = self._now() + HINT_RETRY_S

    def decide(self, digests: Sequence[str], scopes: Sequence[str]) -> Decision:
        """Which of ``digests`` (well-formed, distinct) may be served to a grant of
        ``scopes``, with their sizes from this spoke's manifests."""
        held = self.catalog.scope.lookup(digests)
        decision = Decision()
        for digest in digests:
            found = held.get(digest)
            if found is None:
                decision.unknown.append(digest)
            elif any(covers(scopes, dataset) for dataset in found.datasets):
                decision.allowed.append((digest, found.size))
            else:
                decision.outside.append(digest)
        return decision

    async def close(self) -> None:
        """Stop manifest loads in flight."""
        tasks = list(self._loading.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _name(text: str) -> bool:
    """Whether a dataset or version name from a peer is worth asking the hub about (the
    hub checks it properly; this keeps junk out of hub calls and log lines)."""
    return 0 < len(text) <= MAX_NAME_CHARS and text.isascii() and text.isprintable()


class CallerLimits:
    """Calls and bytes in flight per caller (a grant's subject).

    Args:
        calls: most calls one caller may have in flight.
        nbytes: most bytes of blocks one caller may have in flight.
    """

    def __init__(self, calls: int = CALLS_PER_CALLER, nbytes: int = BYTES_PER_CALLER) -> None:
        self.calls = calls
        self.nbytes = nbytes
        self._held: dict[str, tuple[int, int]] = {}

    def in_flight(self, caller: str) -> tuple[int, int]:
        """Calls and bytes ``caller`` has in flight now."""
        return self._held.get(caller, (0, 0))

    @contextlib.contextmanager
    def admit(self, caller: str, nbytes: int, calls: int = 1) -> Iterator[bool]:
        """While inside, ``caller`` holds ``calls`` more calls (1: a call is admitted; 0:
        the bytes of a call already admitted) and ``nbytes`` more bytes; yields False
        (holding nothing) when that would exceed a limit."""
        held_calls, held = self.in_flight(caller)
        if held_calls + calls > self.calls or held + nbytes > self.nbytes:
            yield False
            return
        self._held[caller] = (held_calls + calls, held + nbytes)
        try:
            yield True
        finally:
            held_calls, held = self._held[caller]
            if (held_calls - calls, held - nbytes) == (0, 0):
                del self._held[caller]
            else:
                self._held[caller] = (held_calls - calls, held - nbytes)


class MemoryBudget:
    """Bytes the peer port holds for callers: at most ``capacity`` in all, at most half of
    it for one caller, and once more than half is held, at most its fair share (the
    capacity over the callers holding some) for a caller asking for more. So one caller
    stalling every call it may make leaves the other half to the others, and a few
    callers filling it leave each newcomer its share as calls end.

    A caller refused is told at once (RESOURCE_EXHAUSTED), not made to wait: it asks the
    hub for those blocks in the same call's time, where a wait here would spend that time
    and make an honest owner look silent to its pace (``spoke.mesh.peerclient.Pace``).

    Args:
        capacity: most bytes held in all (:data:`MEMORY_BUDGET`).
    """

    def __init__(self, capacity: int = MEMORY_BUDGET) -> None:
        self.capacity = capacity
        self.held = 0
        self._held: dict[str, int] = {}

    def held_by(self, caller: str) -> int:
        """Bytes held for ``caller`` now."""
        return self._held.get(caller, 0)

    def take(self, caller: str, nbytes: int) -> bool:
        """Hold ``nbytes`` more for ``caller`` if that keeps within the bounds (True);
        else hold nothing (False)."""
        mine = self.held_by(caller)
        after = self.held + nbytes
        holders = len(self._held) + (0 if mine else 1)
        if (
            after > self.capacity
            or mine + nbytes > self.capacity // 2
            or (after > self.capacity // 2 and mine + nbytes > self.capacity // holders)
        ):
            return False
        self.held = after
        self._held[caller] = mine + nbytes
        metrics.PEER_HELD_BYTES.set(self.held)
        return True

    def give(self, caller: str, nbytes: int) -> None:
        """Release ``nbytes`` held for ``caller``."""
        left = self._held[caller] - nbytes
        if left:
            self._held[caller] = left
        else:
            del self._held[caller]
        self.held -= nbytes
        metrics.PEER_HELD_BYTES.set(self.held)

    @contextlib.contextmanager
    def hold(self, caller: str, nbytes: int) -> Iterator[bool]:
        """While inside, ``nbytes`` are held for ``caller``; yields False (holding
        nothing) when the budget cannot take them (nothing to hold: True)."""
        if not nbytes:
            yield True
            return
        if not self.take(caller, nbytes):
            yield False
            return
        try:
            yield True
        finally:
            self.give(caller, nbytes)


class Refusals:
    """Counts, audits and logs refused peer calls.

    Args:
        audit: the spoke's audit log (None: not written).
        now: the monotonic clock.
    """

    def __init__(self, audit: AuditLog | None, now: Callable[[], float] = time.monotonic) -> None:
        self.audit = audit
        self._now = now
        self._last: dict[str, float] = {}
        self._quiet: dict[str, int] = {}

    def record(
        self,
        reason: str,
        message: str,
        *,
        who: str,
        what: str,
        subject: str | None = None,
        blocks: int | None = None,
        audited: dict[str, object] | None = None,
    ) -> None:
        """One refused call (or a call with ``blocks`` declined) for ``reason``;
        ``audited`` details go to the owner-only audit log only (not to metrics or log)."""
        metrics.PEER_REFUSALS.labels(reason).inc()
        details: dict[str, object] = {"reason": reason, "detail": message[:200]}
        if subject is not None:
            details["subject"] = subject[:100]
        if blocks is not None:
            details["blocks"] = blocks
        details.update(audited or {})
        if self.audit is not None:  # rate-limited there, with a count of what it left out
            self.audit.refused(who=who[:100], what=what, outcome=f"refused: {reason}", **details)
        now = self._now()
        if now - self._last.get(reason, -LOG_EVERY_S) >= LOG_EVERY_S:
            more = self._quiet.pop(reason, 0)
            tail = f" ({more} more since the last line)" if more else ""
            log.warning("peer %s %s refused (%s): %s%s", who, what, reason, message, tail)
            self._last[reason] = now
        else:
            self._quiet[reason] = self._quiet.get(reason, 0) + 1
