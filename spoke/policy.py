"""Eviction policies: which cached block goes next.

A policy tracks keys, their sizes and their recency; it owns no bytes. The cache
(:mod:`spoke.cache`) admits blocks with :meth:`EvictionPolicy.insert`, reports hits with
:meth:`~EvictionPolicy.access`, and calls :meth:`~EvictionPolicy.pop_victim` until it is
under its capacity. Pinned blocks are kept out of the policy altogether while pinned, so a
policy never has to skip them. Byte accounting lives in the base class (the cachetools
shape): a policy is "what an access does" plus "which key goes next".
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterable


class EvictionPolicy(ABC):
    """Byte-weighted bookkeeping shared by every policy.

    Args:
        capacity_bytes: the bytes the policy may keep resident (its ``c``); the cache
            updates it when pins change how much is left for evictable blocks.

    Attributes:
        used_bytes: sum of the sizes of the resident keys, bytes.
    """

    name = "base"

    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes < 0:
            raise ValueError("capacity must be >= 0")
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0

    def resize(self, capacity_bytes: int) -> None:
        """Change the capacity (pins taking or giving back room); evicts nothing itself."""
        self.capacity_bytes = max(0, capacity_bytes)

    @property
    def evict_on_demand(self) -> bool:
        """True when victims should be chosen only as admissions need room, never in
        batches ahead of time (the cache then skips its watermark band). False here."""
        return False

    @abstractmethod
    def __contains__(self, key: object) -> bool:
        """True when ``key`` is resident (ghost entries do not count)."""

    @abstractmethod
    def __len__(self) -> int:
        """Number of resident keys."""

    @abstractmethod
    def insert(self, key: str, size: int) -> None:
        """Admit a new resident ``key`` of ``size`` bytes after a miss (no-op if resident)."""

    @abstractmethod
    def access(self, key: str) -> None:
        """Record a hit on resident ``key`` (ignored if not resident)."""

    @abstractmethod
    def remove(self, key: str) -> int:
        """Forget ``key`` entirely, ghosts included; returns its resident size (0 if none)."""

    @abstractmethod
    def pop_victim(self, exclude: Iterable[str] = ()) -> tuple[str, int] | None:
        """Evict the next key (not one in ``exclude``); returns ``(key, size)`` or None."""

    @abstractmethod
    def resident(self) -> list[str]:
        """Resident keys, the next victim first (as far as the policy can tell)."""

    @abstractmethod
    def check_invariants(self) -> None:
        """Raise AssertionError when internal bookkeeping is inconsistent (used by tests)."""


class LRUPolicy(EvictionPolicy):
    """Byte-weighted least-recently-used: evicts the key whose last access is oldest."""

    name = "lru"

    def __init__(self, capacity_bytes: int = 0) -> None:
        super().__init__(capacity_bytes)
        self._sizes: OrderedDict[str, int] = OrderedDict()

    def __contains__(self, key: object) -> bool:
        return key in self._sizes

    def __len__(self) -> int:
        return len(self._sizes)

    def insert(self, key: str, size: int) -> None:
        """Admit ``key`` as the most recently used entry."""
        _check_size(key, size)
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

    def pop_victim(self, exclude: Iterable[str] = ()) -> tuple[str, int] | None:
        """Evict the least recently used key outside ``exclude``."""
        skip = set(exclude)
        for key in self._sizes:
            if key not in skip:
                return key, self.remove(key)
        return None

    def resident(self) -> list[str]:
        """Keys from least to most recently used."""
        return list(self._sizes)

    def check_invariants(self) -> None:
        """``used_bytes`` equals the sum of resident sizes; sizes are non-negative."""
        assert all(s >= 0 for s in self._sizes.values()), "negative size"
        assert self.used_bytes == sum(self._sizes.values()), "used_bytes out of sync"


class ARCPolicy(EvictionPolicy):
    """Adaptive Replacement Cache, byte-weighted.

    Megiddo & Modha, "ARC: A Self-Tuning, Low Overhead Replacement Cache", FAST 2003
    (Fig. 4). Resident keys live in T1 (seen once recently) and T2 (seen at least twice);
    B1 and B2 remember keys recently evicted from T1 and T2 (ghosts, no data). A hit on a
    ghost in B1 says T1 was too small and grows the target ``p`` for T1; a hit in B2 shrinks
    it. Sizes are in bytes rather than pages: every ``|X|`` of the paper is the byte total of
    list X, and the adaptation steps are scaled by the size of the block that hit the ghost.
    The cache evicts after admission, so REPLACE's "x in B2" case is remembered from the
    last :meth:`insert`.
    """

    name = "arc"

    def __init__(self, capacity_bytes: int) -> None:
        super().__init__(capacity_bytes)
        self.t1: OrderedDict[str, int] = OrderedDict()
        self.t2: OrderedDict[str, int] = OrderedDict()
        self.b1: OrderedDict[str, int] = OrderedDict()
        self.b2: OrderedDict[str, int] = OrderedDict()
        self.t1_bytes = self.t2_bytes = self.b1_bytes = self.b2_bytes = 0
        self.p = 0.0  # target bytes of T1
        self._last_from_b2 = False

    def __contains__(self, key: object) -> bool:
        return key in self.t1 or key in self.t2

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2)

    def insert(self, key: str, size: int) -> None:
        """Admit ``key`` after a miss: from a ghost list into T2 (adapting ``p``), else T1."""
        _check_size(key, size)
        if key in self:
            self.access(key)
            return
        c = self.capacity_bytes
        self._last_from_b2 = False
        if key in self.b1:  # Case II: T1 was too small
            delta = size * max(1.0, self.b2_bytes / max(self.b1_bytes, 1))
            self.p = min(float(c), self.p + delta)
            self.b1_bytes -= self.b1.pop(key)
            self._add(self.t2, key, size, "t2")
        elif key in self.b2:  # Case III: T2 was too small
            delta = size * max(1.0, self.b1_bytes / max(self.b2_bytes, 1))
            self.p = max(0.0, self.p - delta)
            self.b2_bytes -= self.b2.pop(key)
            self._add(self.t2, key, size, "t2")
            self._last_from_b2 = True
        else:  # Case IV: a new key; keep the directory within 2c (L1 <= c, L1 + L2 <= 2c)
            self._add(self.t1, key, size, "t1")
            self._trim_ghosts()

    def access(self, key: str) -> None:
        """Case I: a hit moves the key to T2's MRU end."""
        if key in self.t1:
            size = self.t1.pop(key)
            self.t1_bytes -= size
            self.t2[key] = size
            self.t2_bytes += size
        elif key in self.t2:
            self.t2.move_to_end(key)

    def remove(self, key: str) -> int:
        """Forget ``key`` from every list (e.g. a corrupt or purged block)."""
        size = 0
        if key in self.t1:
            size = self.t1.pop(key)
            self.t1_bytes -= size
        elif key in self.t2:
            size = self.t2.pop(key)
            self.t2_bytes -= size
        if key in self.b1:
            self.b1_bytes -= self.b1.pop(key)
        if key in self.b2:
            self.b2_bytes -= self.b2.pop(key)
        self.used_bytes -= size
        return size

    def pop_victim(self, exclude: Iterable[str] = ()) -> tuple[str, int] | None:
        """REPLACE: evict T1's LRU key into B1 when T1 is over its target, else T2's into B2."""
        skip = set(exclude)
        take_t1 = self.t1_bytes > 0 and (
            self.t1_bytes > self.p or (self._last_from_b2 and self.t1_bytes >= self.p)
        )
        for from_t1 in (True, False) if take_t1 else (False, True):
            resident = self.t1 if from_t1 else self.t2
            key = next((k for k in resident if k not in skip), None)
            if key is None:
                continue
            size = resident.pop(key)
            if from_t1:
                self.t1_bytes -= size
                self.b1[key] = size
                self.b1_bytes += size
            else:
                self.t2_bytes -= size
                self.b2[key] = size
                self.b2_bytes += size
            self.used_bytes -= size
            self._trim_ghosts()
            return key, size
        return None

    def resident(self) -> list[str]:
        """Resident keys: T1 from LRU to MRU, then T2 from LRU to MRU."""
        return [*self.t1, *self.t2]

    def resize(self, capacity_bytes: int) -> None:
        """Change ``c``; ``p`` is clamped to it and the ghost lists trimmed to the new bounds."""
        super().resize(capacity_bytes)
        self.p = min(self.p, float(self.capacity_bytes))
        self._trim_ghosts()

    def ghosts(self) -> list[str]:
        """Ghost keys: B1 then B2, LRU first."""
        return [*self.b1, *self.b2]

    def _add(self, lst: OrderedDict[str, int], key: str, size: int, which: str) -> None:
        lst[key] = size
        if which == "t1":
            self.t1_bytes += size
        else:
            self.t2_bytes += size
        self.used_bytes += size

    def _trim_ghosts(self) -> None:
        """Drop LRU ghosts so that |T1| + |B1| <= c and |T1|+|T2|+|B1|+|B2| <= 2c (bytes)."""
        c = self.capacity_bytes
        while self.b1 and self.t1_bytes + self.b1_bytes > c:
            _, size = self.b1.popitem(last=False)
            self.b1_bytes -= size
        while self.b2 and (self.t1_bytes + self.t2_bytes + self.b1_bytes + self.b2_bytes > 2 * c):
            _, size = self.b2.popitem(last=False)
            self.b2_bytes -= size

    def check_invariants(self) -> None:
        """Byte totals match their lists; lists are disjoint; 0 <= p <= c; ghost bounds hold."""
        for lst, total, name in (
            (self.t1, self.t1_bytes, "T1"),
            (self.t2, self.t2_bytes, "T2"),
            (self.b1, self.b1_bytes, "B1"),
            (self.b2, self.b2_bytes, "B2"),
        ):
            assert total == sum(lst.values()), f"{name} byte total out of sync"
            assert all(s >= 0 for s in lst.values()), f"negative size in {name}"
        keys = [*self.t1, *self.t2, *self.b1, *self.b2]
        assert len(keys) == len(set(keys)), "a key is in two ARC lists"
        assert self.used_bytes == self.t1_bytes + self.t2_bytes, "used_bytes out of sync"
        assert 0.0 <= self.p <= max(self.capacity_bytes, 0), f"p={self.p} outside [0, c]"
        c = self.capacity_bytes
        assert not self.b1 or self.t1_bytes + self.b1_bytes <= c, "|T1|+|B1| > c"
        assert not self.b2 or (
            self.t1_bytes + self.t2_bytes + self.b1_bytes + self.b2_bytes <= 2 * c
        ), "directory > 2c"


def _check_size(key: str, size: int) -> None:
    if size < 0:
        raise ValueError(f"negative size {size} for {key}")


POLICIES: dict[str, type[EvictionPolicy]] = {"arc": ARCPolicy, "lru": LRUPolicy}


def make_policy(name: str, capacity_bytes: int) -> EvictionPolicy:
    """Build a policy by its command-line name (``arc`` or ``lru``).

    Raises:
        ValueError: unknown policy name.
    """
    try:
        return POLICIES[name](capacity_bytes)
    except KeyError:
        raise ValueError(f"unknown cache policy {name!r} (choose: arc, lru)") from None
