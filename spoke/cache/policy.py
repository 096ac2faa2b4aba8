"""Eviction policies: which cached block goes next.

A policy tracks keys, their sizes and their recency; it owns no bytes. The cache
(:mod:`spoke.cache.blockcache`) admits blocks with :meth:`EvictionPolicy.insert`, reports hits with
:meth:`~EvictionPolicy.access`, and calls :meth:`~EvictionPolicy.pop_victim` until it is
under its capacity. Pinned blocks are kept out of the policy altogether while pinned, so a
policy never has to skip them.

Byte accounting lives in one base class, :class:`ByteWeightedPolicy` (the cachetools
shape): it alone keeps each resident key's size and :attr:`~EvictionPolicy.used_bytes`; a
policy subclasses it with "what an admission does" (:meth:`~ByteWeightedPolicy._admit`),
"what a hit does" (:meth:`~ByteWeightedPolicy._hit`) and "which key goes next"
(:meth:`~ByteWeightedPolicy._evict`). Blocks fetched ahead of any reader (readahead, fill,
hints) are admitted with ``insert(..., prefetched=True)`` at the *cold end*, the same for
every policy: the base class keeps them, unread, in arrival order outside the policy's
own lists, every victim is taken from them first, and a block's first read is its
admission (``_admit``, exactly what a demand miss at that moment would do, ghost lists
included). So a prefetched block never displaces a block the policy ranks, and a right
guess leaves the policy in the state a miss would have. LRU and ARC live here; SIEVE in
:mod:`spoke.cache.sieve`, S3-FIFO in :mod:`spoke.cache.s3fifo`; :mod:`spoke.cache.registry`
names them for ``--policy``.
:class:`spoke.cache.hinted.HintedPolicy` wraps one of them and reads its accounting instead of
keeping a copy.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterable


class EvictionPolicy(ABC):
    """What the cache asks of a policy.

    Args:
        capacity_bytes: the bytes the policy may keep resident (its ``c``); the cache
            updates it when pins change how much is left for evictable blocks.

    Raises:
        ValueError: ``capacity_bytes`` is negative.
    """

    name = "base"

    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes < 0:
            raise ValueError("capacity must be >= 0")
        self.capacity_bytes = capacity_bytes

    def resize(self, capacity_bytes: int) -> None:
        """Change the capacity (pins taking or giving back room); evicts nothing itself."""
        self.capacity_bytes = max(0, capacity_bytes)

    @property
    def evict_on_demand(self) -> bool:
        """True when victims should be chosen only as admissions need room, never in
        batches ahead of time (the cache then skips its watermark band). False here."""
        return False

    @property
    @abstractmethod
    def used_bytes(self) -> int:
        """Sum of the sizes of the resident keys, bytes."""

    @property
    def unread_bytes(self) -> int:
        """Bytes of prefetched keys not read yet (part of :attr:`used_bytes`)."""
        return 0

    def unread(self) -> list[str]:
        """Prefetched keys not read yet, the next victim first (the cold end)."""
        return []

    @abstractmethod
    def size_of(self, key: str) -> int:
        """Resident size of ``key`` in bytes (0 when not resident)."""

    @abstractmethod
    def __contains__(self, key: object) -> bool:
        """True when ``key`` is resident (ghost entries do not count)."""

    @abstractmethod
    def __len__(self) -> int:
        """Number of resident keys."""

    @abstractmethod
    def insert(self, key: str, size: int, prefetched: bool = False) -> None:
        """Admit a new resident ``key`` of ``size`` bytes after a miss (a hit if resident).

        With ``prefetched`` (fetched ahead of any reader) the key goes to the cold end,
        unread: it is evicted before any key the policy ranks, and its first
        :meth:`access` admits it as a miss would; a key already resident is left as it is
        (a prefetch is not a read).

        Raises:
            ValueError: ``size`` is negative.
        """

    @abstractmethod
    def access(self, key: str) -> None:
        """Record a hit on resident ``key`` (ignored if not resident)."""

    @abstractmethod
    def remove(self, key: str) -> int:
        """Forget ``key`` entirely, ghosts included; returns its resident size (0 if none)."""

    @abstractmethod
    def pop_victim(
        self, exclude: Iterable[str] = (), spare_unread: bool = False
    ) -> tuple[str, int] | None:
        """Evict the next key (not one in ``exclude``, nor an unread prefetched key with
        ``spare_unread``); returns ``(key, size)`` or None."""

    @abstractmethod
    def resident(self) -> list[str]:
        """Resident keys, the next victim first (as far as the policy can tell)."""

    @abstractmethod
    def check_invariants(self) -> None:
        """Raise AssertionError when internal bookkeeping is inconsistent (used by tests)."""


class ByteWeightedPolicy(EvictionPolicy):
    """The one place sizes are kept: resident key -> size, and their sum.

    The public methods do the accounting and call the subclass's hooks, which only move
    keys between the policy's own lists: :meth:`_admit` places a new resident key,
    :meth:`_hit` records a hit, :meth:`_discard` forgets a key (resident or ghost),
    :meth:`_evict` takes the next victim out of the lists, and :meth:`_ranked` lists them
    in victim order. A hook may read a resident key's size with :meth:`size_of`; the size
    is still there while :meth:`_evict` and :meth:`_discard` run.

    Prefetched keys not read yet (:meth:`unread`) are kept here, oldest first, in none of
    the subclass's lists: the cold end. :meth:`pop_victim` takes them first; a read
    (:meth:`access`, or a demand :meth:`insert`) hands the key to :meth:`_admit`.

    Attributes:
        used_bytes: sum of the sizes of the resident keys, bytes (read-only).
    """

    def __init__(self, capacity_bytes: int) -> None:
        super().__init__(capacity_bytes)
        self._sizes: dict[str, int] = {}
        self._used = 0
        self._unread: OrderedDict[str, None] = OrderedDict()  # prefetched, unread; oldest first
        self._unread_bytes = 0

    @property
    def used_bytes(self) -> int:
        """Sum of the sizes of the resident keys, bytes."""
        return self._used

    @property
    def unread_bytes(self) -> int:
        """Bytes of prefetched keys not read yet (part of :attr:`used_bytes`)."""
        return self._unread_bytes

    def size_of(self, key: str) -> int:
        """Resident size of ``key`` in bytes (0 when not resident)."""
        return self._sizes.get(key, 0)

    def __contains__(self, key: object) -> bool:
        return key in self._sizes

    def __len__(self) -> int:
        return len(self._sizes)

    def insert(self, key: str, size: int, prefetched: bool = False) -> None:
        """Admit ``key`` after a miss; a key already resident counts as a hit. A
        ``prefetched`` key goes to the cold end, unread (a resident one stays as it is).

        Raises:
            ValueError: ``size`` is negative.
        """
        if size < 0:
            raise ValueError(f"negative size {size} for {key}")
        if key in self._sizes:
            if not prefetched:
                self._read(key)
            return
        self._sizes[key] = size
        self._used += size
        if prefetched:
            self._unread[key] = None
            self._unread_bytes += size
        else:
            self._admit(key, size)

    def access(self, key: str) -> None:
        """Record a hit on ``key`` (ignored when not resident); the first read of a
        prefetched key admits it as a miss would."""
        if key in self._sizes:
            self._read(key)

    def _read(self, key: str) -> None:
        if key in self._unread:
            del self._unread[key]
            self._unread_bytes -= self._sizes[key]
            self._admit(key, self._sizes[key])
        else:
            self._hit(key)

    def unread(self) -> list[str]:
        """Prefetched keys not read yet, the next victim first (the cold end)."""
        return list(self._unread)

    def remove(self, key: str) -> int:
        """Forget ``key`` (ghosts included); returns its resident size (0 if none)."""
        if self._unread.pop(key, 0) is None:
            self._unread_bytes -= self._sizes[key]
        self._discard(key)
        size = self._sizes.pop(key, 0)
        self._used -= size
        return size

    def pop_victim(
        self, exclude: Iterable[str] = (), spare_unread: bool = False
    ) -> tuple[str, int] | None:
        """Evict the next victim outside ``exclude``: an unread prefetched key first
        (unless ``spare_unread``), else the policy's; returns ``(key, size)``."""
        skip = set(exclude)
        key = None if spare_unread else next((k for k in self._unread if k not in skip), None)
        if key is not None:
            del self._unread[key]
            self._unread_bytes -= self._sizes[key]
        else:
            key = self._evict(skip)
        if key is None:
            return None
        size = self._sizes.pop(key)
        self._used -= size
        return key, size

    def resident(self) -> list[str]:
        """Resident keys, the next victim first: the unread prefetched ones, then the
        policy's own order (:meth:`_ranked`)."""
        return [*self._unread, *self._ranked()]

    @property
    def _ranked_keys(self) -> set[str]:
        """Resident keys in the policy's own lists (every one but the unread)."""
        return set(self._sizes).difference(self._unread)

    @abstractmethod
    def _admit(self, key: str, size: int) -> None:
        """Place a new resident ``key`` (already counted) in the policy's lists."""

    @abstractmethod
    def _hit(self, key: str) -> None:
        """Record a hit on resident ``key``."""

    @abstractmethod
    def _discard(self, key: str) -> None:
        """Drop ``key`` from every list, ghost lists included (it may be in none)."""

    @abstractmethod
    def _evict(self, skip: set[str]) -> str | None:
        """Take the next victim outside ``skip`` out of the resident lists (into a ghost
        list if the policy keeps one); None when every key in them is in ``skip``."""

    @abstractmethod
    def _ranked(self) -> list[str]:
        """The keys in the policy's own lists, the next victim first."""

    def check_invariants(self) -> None:
        """Sizes are non-negative and ``used_bytes`` is their sum; unread keys are
        resident; subclasses add theirs."""
        assert all(s >= 0 for s in self._sizes.values()), "negative size"
        assert self._used == sum(self._sizes.values()), "used_bytes out of sync"
        assert set(self._unread) <= set(self._sizes), "an unread key is not resident"
        assert self._unread_bytes == sum(self._sizes[k] for k in self._unread), "unread bytes"


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


def make_policy(name: str, capacity_bytes: int) -> EvictionPolicy:
    """Build a policy by its ``--policy`` name: :func:`spoke.cache.registry.make_policy`, kept
    here for callers of this module (the registry imports this module, hence the late
    import).

    Raises:
        ValueError: unknown policy name, or a negative capacity.
    """
    from spoke.cache.registry import make_policy as build

    return build(name, capacity_bytes)
