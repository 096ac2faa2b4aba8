"""LRU eviction, byte-weighted: the key whose last access is oldest goes next.

Byte weighting: the cache calls :meth:`~spoke.cache.policy.EvictionPolicy.pop_victim` until
it is within capacity, so a block larger than the free room evicts as many keys as its
bytes need.
"""

from __future__ import annotations

from collections import OrderedDict

from spoke.cache.policy import ByteWeightedPolicy


class LRUPolicy(ByteWeightedPolicy):
    """Byte-weighted least-recently-used: evicts the key whose last access is oldest."""

    name = "lru"

    def __init__(self, capacity_bytes: int = 0) -> None:
        super().__init__(capacity_bytes)
        self._order: OrderedDict[str, None] = OrderedDict()  # LRU first

    def _admit(self, key: str, size: int) -> None:
        self._order[key] = None

    def _hit(self, key: str) -> None:
        self._order.move_to_end(key)

    def _discard(self, key: str) -> None:
        self._order.pop(key, None)

    def _evict(self, skip: set[str]) -> str | None:
        key = next((k for k in self._order if k not in skip), None)
        if key is not None:
            del self._order[key]
        return key

    def _ranked(self) -> list[str]:
        """Keys from least to most recently used."""
        return list(self._order)

    def check_invariants(self) -> None:
        """The base class's, and the recency order holds exactly the ranked keys."""
        super().check_invariants()
        assert set(self._order) == self._ranked_keys, "recency order out of sync"
