"""The hits' recency on its way to the index: ticks gathered on the event loop and
written in one transaction at most once per :data:`RECENCY_FLUSH_S`
(:class:`PendingRecency`), for :class:`spoke.cache.blockcache.BlockCache`, which ranks
the hits in its policy at once.
"""

from __future__ import annotations

import time

from spoke.cache.store import BlockStore

RECENCY_FLUSH_S = 1.0
"""Hits' recency reaches the index at most once per this many seconds (the first batch
after a quiet second at once, the rest with the next batch after it, and at close). While
a hint is installed the mount reports hits every 10 ms; one index transaction per report
was the daemon's largest cost in a hinted run (py-spy: 50 samples of 6 s against 8 with
background fill). A crash loses at most this much recency, never a block."""


class PendingRecency:
    """Recency ticks of hits not yet in the index (loop-only state)."""

    def __init__(self, store: BlockStore) -> None:
        self.store = store
        self._touched: dict[str, int] = {}  # recency ticks not yet in the index
        self._touched_at = -RECENCY_FLUSH_S  # monotonic time of the last flush

    def forget(self, digest: str) -> None:
        """Drop ``digest``'s pending tick (its admission writes a newer one)."""
        self._touched.pop(digest, None)

    def add(self, ticks: dict[str, int]) -> None:
        """Gather a batch of hits' ticks; flush when the last flush is a second old."""
        self._touched.update(ticks)
        if time.monotonic() - self._touched_at >= RECENCY_FLUSH_S:
            self.flush()

    def flush(self) -> None:
        """Write the ticks gathered since the last flush to the index, in one transaction."""
        self._touched_at = time.monotonic()
        if self._touched:
            ticks, self._touched = self._touched, {}
            self.store.touch(ticks)
