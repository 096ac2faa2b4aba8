"""The block cache: block store + eviction policy + capacity.

Runs on the daemon's event loop; only the file writes go to worker threads. The cache
never holds more than its capacity plus the block being admitted (a block larger than
the whole cache is still admitted, alone).
"""

from __future__ import annotations

import asyncio
import logging

from spoke import metrics
from spoke.policy import EvictionPolicy
from spoke.store import BlockStore

log = logging.getLogger(__name__)


class BlockCache:
    """Cached blocks, their recency, and eviction to stay within ``capacity_bytes``.

    Args:
        store: block files and index; recovered (stray temp files removed) on construction.
        policy: decides eviction order; rebuilt from the index's recency ticks.
        capacity_bytes: the most block bytes kept on disk (``--cache-size``).
    """

    def __init__(self, store: BlockStore, policy: EvictionPolicy, capacity_bytes: int) -> None:
        if capacity_bytes <= 0:
            raise ValueError("cache capacity must be positive")
        self.store = store
        self.policy = policy
        self.capacity_bytes = capacity_bytes
        self._tick = 0
        for block in store.recover():
            policy.insert(block.digest, block.size)
            self._tick = max(self._tick, block.tick)
        metrics.CACHE_CAPACITY_BYTES.set(capacity_bytes)
        self._evict(protect=None)
        self._update_gauges()
        log.info(
            "cache: %d blocks, %d bytes of %d recovered",
            len(policy),
            policy.used_bytes,
            capacity_bytes,
        )

    def contains(self, digest: str) -> bool:
        """True when ``digest`` is resident."""
        return digest in self.policy

    @property
    def used_bytes(self) -> int:
        """Bytes of resident blocks."""
        return self.policy.used_bytes

    async def admit(self, digest: str, data: bytes) -> None:
        """Write a verified block to disk, then evict down to capacity.

        Raises:
            OSError: the write failed (e.g. ENOSPC); the cache is unchanged.
        """
        if digest in self.policy:
            return
        self._tick += 1
        await asyncio.to_thread(self.store.write, digest, data, self._tick)
        self.policy.insert(digest, len(data))
        self._evict(protect=digest)
        self._update_gauges()

    def record_access(self, digests: list[str]) -> int:
        """Apply a batch of hits to the policy and persist their recency.

        Returns:
            How many of ``digests`` were resident.
        """
        ticks: dict[str, int] = {}
        for digest in digests:
            if digest in self.policy:
                self.policy.access(digest)
                self._tick += 1
                ticks[digest] = self._tick
        if ticks:
            self.store.touch(ticks)
        return len(ticks)

    def _evict(self, protect: str | None) -> None:
        exclude = () if protect is None else (protect,)
        while self.policy.used_bytes > self.capacity_bytes:
            victim = self.policy.victim(exclude)
            if victim is None:
                return
            size = self.policy.remove(victim)
            self.store.delete(victim)
            metrics.EVICTIONS.inc()
            metrics.EVICTED_BYTES.inc(size)

    def _update_gauges(self) -> None:
        metrics.CACHE_USED_BYTES.set(self.policy.used_bytes)
        metrics.CACHE_BLOCKS.set(len(self.policy))
