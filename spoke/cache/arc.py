"""ARC eviction (Adaptive Replacement Cache), byte-weighted.

Megiddo & Modha, "ARC: A Self-Tuning, Low Overhead Replacement Cache", FAST 2003 (Fig. 4);
how the paper's page counts become bytes: :class:`ARCPolicy`.
"""

from __future__ import annotations

from collections import OrderedDict

from spoke.cache.policy import ByteWeightedPolicy


class ARCPolicy(ByteWeightedPolicy):
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
        self.t1: OrderedDict[str, None] = OrderedDict()  # resident: sizes in the base class
        self.t2: OrderedDict[str, None] = OrderedDict()
        self.b1: OrderedDict[str, int] = OrderedDict()  # ghosts: key -> size when evicted
        self.b2: OrderedDict[str, int] = OrderedDict()
        self.t1_bytes = self.t2_bytes = self.b1_bytes = self.b2_bytes = 0
        self.p = 0.0  # target bytes of T1
        self._last_from_b2 = False

    def _admit(self, key: str, size: int) -> None:
        """A miss: from a ghost list into T2 (adapting ``p``), else into T1."""
        c = self.capacity_bytes
        self._last_from_b2 = False
        if key in self.b1:  # Case II: T1 was too small
            delta = size * max(1.0, self.b2_bytes / max(self.b1_bytes, 1))
            self.p = min(float(c), self.p + delta)
            self.b1_bytes -= self.b1.pop(key)
            self.t2[key] = None
            self.t2_bytes += size
        elif key in self.b2:  # Case III: T2 was too small
            delta = size * max(1.0, self.b1_bytes / max(self.b2_bytes, 1))
            self.p = max(0.0, self.p - delta)
            self.b2_bytes -= self.b2.pop(key)
            self.t2[key] = None
            self.t2_bytes += size
            self._last_from_b2 = True
        else:  # Case IV: a new key; keep the directory within 2c (L1 <= c, L1 + L2 <= 2c)
            self.t1[key] = None
            self.t1_bytes += size
            self._trim_ghosts()

    def _hit(self, key: str) -> None:
        """Case I: a hit moves the key to T2's MRU end."""
        if key in self.t1:
            del self.t1[key]
            size = self.size_of(key)
            self.t1_bytes -= size
            self.t2[key] = None
            self.t2_bytes += size
        else:
            self.t2.move_to_end(key)

    def _discard(self, key: str) -> None:
        """Forget ``key`` from every list (e.g. a corrupt or purged block)."""
        if key in self.t1:
            del self.t1[key]
            self.t1_bytes -= self.size_of(key)
        elif key in self.t2:
            del self.t2[key]
            self.t2_bytes -= self.size_of(key)
        if key in self.b1:
            self.b1_bytes -= self.b1.pop(key)
        if key in self.b2:
            self.b2_bytes -= self.b2.pop(key)

    def _evict(self, skip: set[str]) -> str | None:
        """REPLACE: evict T1's LRU key into B1 when T1 is over its target, else T2's into B2."""
        take_t1 = self.t1_bytes > 0 and (
            self.t1_bytes > self.p or (self._last_from_b2 and self.t1_bytes >= self.p)
        )
        for from_t1 in (True, False) if take_t1 else (False, True):
            resident = self.t1 if from_t1 else self.t2
            key = next((k for k in resident if k not in skip), None)
            if key is None:
                continue
            del resident[key]
            size = self.size_of(key)
            if from_t1:
                self.t1_bytes -= size
                self.b1[key] = size
                self.b1_bytes += size
            else:
                self.t2_bytes -= size
                self.b2[key] = size
                self.b2_bytes += size
            self._trim_ghosts()
            return key
        return None

    def _ranked(self) -> list[str]:
        """T1 from LRU to MRU, then T2 from LRU to MRU."""
        return [*self.t1, *self.t2]

    def resize(self, capacity_bytes: int) -> None:
        """Change ``c``; ``p`` is clamped to it and the ghost lists trimmed to the new bounds."""
        super().resize(capacity_bytes)
        self.p = min(self.p, float(self.capacity_bytes))
        self._trim_ghosts()

    def ghosts(self) -> list[str]:
        """Ghost keys: B1 then B2, LRU first."""
        return [*self.b1, *self.b2]

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
        super().check_invariants()
        for total, want, name in (
            (self.t1_bytes, sum(self.size_of(k) for k in self.t1), "T1"),
            (self.t2_bytes, sum(self.size_of(k) for k in self.t2), "T2"),
            (self.b1_bytes, sum(self.b1.values()), "B1"),
            (self.b2_bytes, sum(self.b2.values()), "B2"),
        ):
            assert total == want, f"{name} byte total out of sync"
        assert all(s >= 0 for s in [*self.b1.values(), *self.b2.values()]), "negative ghost"
        keys = [*self.t1, *self.t2, *self.b1, *self.b2]
        assert len(keys) == len(set(keys)), "a key is in two ARC lists"
        assert set(self.t1) | set(self.t2) == self._ranked_keys, "T1 + T2 != ranked keys"
        assert 0.0 <= self.p <= max(self.capacity_bytes, 0), f"p={self.p} outside [0, c]"
        c = self.capacity_bytes
        assert not self.b1 or self.t1_bytes + self.b1_bytes <= c, "|T1|+|B1| > c"
        assert not self.b2 or (
            self.t1_bytes + self.t2_bytes + self.b1_bytes + self.b2_bytes <= 2 * c
        ), "directory > 2c"
