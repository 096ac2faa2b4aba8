"""The access log: one place where the daemon hears that blocks were read.

The mount reports every block read, as a hit (``RecordAccess``, batched) or a miss
(``EnsureBlocks``). :meth:`AccessLog.record` counts it and hands it, in order, to every
subscriber (``spoke.run.daemon`` subscribes them): the eviction policy (hits; a miss is
admitted later), the hint streams' cursors, the prefetch ledger, the tenants' read counts
(with ``--tenants``), background fill, the steady-state detector and the retention clock.
Cross-file readahead is the mount's own (``fusemount.crossfile``). Local RPCs call
:meth:`AccessLog.record` once instead of fanning out by hand. Prewarm and fill fetches are
not reads and never come here, so they are neither hits nor misses.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from spoke import metrics

log = logging.getLogger(__name__)

Subscriber = Callable[[Sequence[str], bool], None]
"""Called with ``(digests, hit)`` for every record, in order."""


class AccessLog:
    """Counts block reads and fans them out to subscribers, in subscription order."""

    def __init__(self) -> None:
        self._subscribers: list[tuple[str, Subscriber]] = []

    def subscribe(self, name: str, subscriber: Subscriber) -> None:
        """Add ``subscriber`` (``name`` is for the log when it fails)."""
        self._subscribers.append((name, subscriber))

    def record(self, digests: Sequence[str], hit: bool) -> None:
        """Readers read ``digests``: hits (served from the cache) or misses.

        A subscriber that raises is logged and skipped; the others still hear of the read
        (one broken consumer must not stop the policy from seeing accesses).
        """
        if not digests:
            return
        (metrics.CACHE_HITS if hit else metrics.CACHE_MISSES).inc(len(digests))
        for name, subscriber in self._subscribers:
            try:
                subscriber(digests, hit)
            except Exception:
                log.exception("access subscriber %s failed", name)


class SteadyState:
    """Time to steady state: from the first read this daemon saw to the start of the first
    ``window_s`` of reads that were nearly all hits (misses ≤ ``miss_fraction`` of reads).

    An access-log subscriber; the answer goes to ``strata_spoke_steady_state_seconds``
    (0 until reached; a later cold phase, such as a new snapshot, starts the clock again).

    Args:
        window_s: length of the window judged, seconds.
        miss_fraction: most misses per read in a steady window.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        window_s: float = 5.0,
        miss_fraction: float = 0.01,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window_s = window_s
        self.miss_fraction = miss_fraction
        self._clock = clock
        self._first: float | None = None  # first read of the current cold phase
        self._window_start = 0.0
        self._reads = 0
        self._misses = 0
        self.seconds: float | None = None

    def observe(self, digests: Sequence[str], hit: bool) -> None:
        """Count reads into the current window; judge a window once it is over."""
        now = self._clock()
        if self._first is None:
            self._first = self._window_start = now
        if now - self._window_start >= self.window_s:
            steady = self._reads > 0 and self._misses <= self.miss_fraction * self._reads
            if self.seconds is None and steady:
                self.seconds = self._window_start - self._first
                metrics.STEADY_STATE_SECONDS.set(self.seconds)
            elif self.seconds is not None and not steady and self._misses:
                self._first, self.seconds = self._window_start, None  # cold again
                metrics.STEADY_STATE_SECONDS.set(0)
            self._window_start, self._reads, self._misses = now, 0, 0
        self._reads += len(digests)
        if not hit:
            self._misses += len(digests)
