"""Eviction policies: which cached block goes next.

A policy only tracks keys, their sizes and their recency; it owns no bytes. The cache
(:mod:`spoke.cache`) asks it for victims until the cache is under its capacity. Size
accounting lives in :class:`EvictionPolicy`, so a policy is "what an access does" plus
"which key to evict next" (the cachetools shape).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterable


class EvictionPolicy(ABC):
    """Byte-weighted bookkeeping shared by every policy.

    Attributes:
        used_bytes: sum of the sizes of the resident keys, bytes.
    """

    def __init__(self) -> None:
        self.used_bytes = 0

    @abstractmethod
    def __contains__(self, key: object) -> bool: ...

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def insert(self, key: str, size: int) -> None:
        """Admit a new resident ``key`` of ``size`` bytes (ignored if already resident)."""

    @abstractmethod
    def access(self, key: str) -> None:
        """Record a hit on ``key`` (ignored if not resident)."""

    @abstractmethod
    def remove(self, key: str) -> int:
        """Forget ``key``; returns its size in bytes (0 if it was not resident)."""

    @abstractmethod
    def victim(self, exclude: Iterable[str] = ()) -> str | None:
        """The key to evict next, not in ``exclude``; None when nothing can go."""

    @abstractmethod
    def check_invariants(self) -> None:
        """Raise AssertionError when internal bookkeeping is inconsistent (used by tests)."""


class LRUPolicy(EvictionPolicy):
    """Byte-weighted least-recently-used: evicts the key whose last access is oldest."""

    def __init__(self) -> None:
        super().__init__()
        self._sizes: OrderedDict[str, int] = OrderedDict()

    def __contains__(self, key: object) -> bool:
        return key in self._sizes

    def __len__(self) -> int:
        return len(self._sizes)

    def insert(self, key: str, size: int) -> None:
        """Admit ``key`` as the most recently used entry."""
        if size < 0:
            raise ValueError(f"negative size {size} for {key}")
        if key in self._sizes:
            self._sizes.move_to_end(key)
            return
        self._sizes[key] = size
        self.used_bytes += size

    def access(self, key: str) -> None:
        """Move ``key`` to the most recently used end."""
        if key in self._sizes:
            self._sizes.move_to_end(key)

    def remove(self, key: str) -> int:
        """Forget ``key``; returns its size in bytes."""
        size = self._sizes.pop(key, 0)
        self.used_bytes -= size
        return size

    def victim(self, exclude: Iterable[str] = ()) -> str | None:
        """The least recently used key outside ``exclude``."""
        skip = set(exclude)
        for key in self._sizes:
            if key not in skip:
                return key
        return None

    def keys_lru_first(self) -> list[str]:
        """Resident keys from least to most recently used."""
        return list(self._sizes)

    def check_invariants(self) -> None:
        """``used_bytes`` equals the sum of resident sizes, and every size is non-negative."""
        assert all(s >= 0 for s in self._sizes.values()), "negative size"
        assert self.used_bytes == sum(self._sizes.values()), "used_bytes out of sync"


def make_policy(name: str) -> EvictionPolicy:
    """Build a policy by its command-line name.

    Raises:
        ValueError: unknown policy name.
    """
    if name == "lru":
        return LRUPolicy()
    raise ValueError(f"unknown cache policy {name!r} (choose: lru)")
