"""The access log: one place where the daemon hears that blocks were read.

The mount reports every block read, as a hit (``RecordAccess``, batched) or a miss
(``EnsureBlocks``). :meth:`AccessLog.record` counts it and hands it, in order, to every
subscriber: the eviction policy (hits; a miss is admitted later), the hint streams'
cursors, the prefetch ledger, cross-file readahead and background fill. Local RPCs call
:meth:`AccessLog.record` once instead of fanning out by hand. Prewarm and fill fetches are
not reads and never come here, so they are neither hits nor misses.
"""

from __future__ import annotations

import logging
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
