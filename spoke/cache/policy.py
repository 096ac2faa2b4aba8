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
guess leaves the policy in the state a miss would have. The policies: LRU in
:mod:`spoke.cache.lru`, ARC in :mod:`spoke.cache.arc`, SIEVE in :mod:`spoke.cache.sieve`,
S3-FIFO in :mod:`spoke.cache.s3fifo`; :mod:`spoke.cache.registry` names them for
``--policy``. :class:`spoke.cache.hinted.HintedPolicy` wraps one of them and reads its
accounting instead of keeping a copy.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Iterable

Keep = Callable[[str], bool]
"""Keys a victim search must pass over, as a predicate (a tenant's share,
:class:`spoke.cache.tenants.Keeper`)."""


class Skip(set[str]):
    """Keys a victim search passes over: a set, and every key ``keep`` says to keep."""

    def __init__(self, keys: Iterable[str] = (), keep: Keep | None = None) -> None:
        super().__init__(keys)
        self.keep = keep

    def __contains__(self, key: object) -> bool:
        if set.__contains__(self, key):
            return True
        return self.keep is not None and isinstance(key, str) and self.keep(key)


def skip_set(exclude: Iterable[str], keep: Keep | None) -> set[str]:
    """What a victim search passes over: ``exclude`` and, with ``keep``, what it keeps
    (a plain set when there is no ``keep``: the search runs at the set's speed)."""
    return Skip(exclude, keep) if keep is not None else set(exclude)


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
        self, exclude: Iterable[str] = (), spare_unread: bool = False, keep: Keep | None = None
    ) -> tuple[str, int] | None:
        """Evict the next key (not one in ``exclude`` or that ``keep`` keeps, nor an unread
        prefetched key with ``spare_unread``); returns ``(key, size)`` or None."""

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

    Its twenty methods are the :class:`EvictionPolicy` interface and the five hooks it
    calls: one concern (the sizes and the cold end), kept in one class so that no policy
    keeps sizes of its own.

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
        self, exclude: Iterable[str] = (), spare_unread: bool = False, keep: Keep | None = None
    ) -> tuple[str, int] | None:
        """Evict the next victim outside ``exclude`` and not kept by ``keep``: an unread
        prefetched key first (unless ``spare_unread``), else the policy's; returns
        ``(key, size)``."""
        skip = skip_set(exclude, keep)
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
