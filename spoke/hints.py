"""Clairvoyant caching from read-order hints: Belady's rule on a job's planned reads.

A training job with a seeded shuffling sampler knows, before an epoch starts, the order in
which it will read every chunk. NoPFS (Dryden et al., "Clairvoyant Prefetching for
Distributed Machine Learning I/O", SC 2021) uses exactly that knowledge, derived from the
shuffle seed, to prefetch in read order and to evict the sample needed farthest in the
future. That eviction rule is Belady's MIN (Belady, "A study of replacement algorithms for
a virtual-storage computer", IBM Systems Journal 1966), optimal for uniform block sizes.

Two pieces:

* :class:`HintedPolicy` wraps the configured policy (ARC or LRU). With no hint installed it
  *is* that policy. With a hint (block digests in planned read order) it evicts blocks the
  hint never reads again first (least recently used first), then the block whose next
  hinted read is farthest. A cursor follows the reads the mount reports
  (:meth:`HintedPolicy.observe`); reads may arrive out of order within ``tolerance``
  positions (DataLoader workers, batched hit reports) and a repeated report of one read is
  not mistaken for the block's next hinted read.
* :class:`HintService` resolves the admin API's ``POST /v1/hints`` into blocks, installs
  them in the policy and keeps prefetching a window of blocks ahead of the reads observed.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spoke.policy import EvictionPolicy

if TYPE_CHECKING:
    from spoke.cache import BlockCache
    from spoke.fetcher import Fetcher

log = logging.getLogger(__name__)

NEVER = 1 << 62  # "next use" of a block the hint does not read again
DEFAULT_TOLERANCE = 32  # hinted positions a read may arrive out of order


class HintedPolicy(EvictionPolicy):
    """Belady's farthest-next-use eviction over a read-order hint; ``inner`` otherwise.

    Residency and byte accounting stay in ``inner``: every call is forwarded there, so the
    wrapped policy keeps learning and takes over unchanged when the hint is cleared. Only
    :meth:`pop_victim` differs while a hint is installed.

    Args:
        inner: the fallback policy (the daemon's ``--policy``).
        tolerance: how far (in hinted positions) reads may be out of order; reads more than
            this ahead of the oldest unread position move it forward (a skipped or
            unreported read does not pin its block forever).
        in_use: the blocks of this many latest reads count as still being read (next use
            -1): a block the mount asked for must not be evicted by prefetches landing
            before the mount has read it. 0 (pure Belady) in simulation.
    """

    def __init__(
        self, inner: EvictionPolicy, tolerance: int = DEFAULT_TOLERANCE, in_use: int = 0
    ) -> None:
        super().__init__(inner.capacity_bytes)
        if tolerance < 1 or in_use < 0:
            raise ValueError("tolerance must be >= 1 and in_use >= 0")
        self.in_use = in_use
        self._recent: OrderedDict[str, None] = OrderedDict()  # last ``in_use`` blocks read
        self.inner = inner
        self.name = f"hinted+{inner.name}"
        self.tolerance = tolerance
        self._hint: list[str] = []
        self._positions: dict[str, list[int]] = {}  # digest -> its hinted positions, ascending
        self.cursor = 0  # every position before it has been read (or skipped)
        self.frontier = 0  # one past the farthest position read
        self._ahead: set[int] = set()  # positions >= cursor already read (out of order)
        self._last: dict[str, tuple[int, int]] = {}  # digest -> (last position read, _reads then)
        self._reads = 0
        self._next: dict[str, int] = {}  # resident digest -> next hinted use (finite only)
        self._never: OrderedDict[str, None] = OrderedDict()  # resident, not read again; LRU first
        self._heap: list[tuple[int, int, str]] = []  # (-next use, tiebreak, digest); lazy
        self._seq = itertools.count()

    # -- the hint --------------------------------------------------------------------------

    @property
    def active(self) -> bool:
        """True while a hint is installed."""
        return bool(self._hint)

    @property
    def hint_length(self) -> int:
        """Positions in the installed hint (read ones included)."""
        return len(self._hint)

    def set_hint(self, digests: Sequence[str], append: bool = False) -> None:
        """Install ``digests`` as the planned read order (``append``: after the current one).

        Replacing starts the cursor at the first position. Appending keeps the cursor and
        drops the read prefix once it is at least half of the hint.
        """
        if append and self._hint:
            if self.cursor and self.cursor * 2 >= len(self._hint):
                self._rebase(self.cursor)
            start = len(self._hint)
            self._hint.extend(digests)
            for pos, digest in enumerate(digests, start):
                self._positions.setdefault(digest, []).append(pos)
        else:
            self._hint = list(digests)
            self._positions = {}
            for pos, digest in enumerate(self._hint):
                self._positions.setdefault(digest, []).append(pos)
            self.cursor = self.frontier = self._reads = 0
            self._ahead.clear()
            self._recent.clear()
            self._last.clear()
        self._recompute_all()

    def clear_hint(self) -> None:
        """Forget the hint; eviction is the wrapped policy's again."""
        self.set_hint([])

    def upcoming(self, count: int) -> list[str]:
        """Digests of the next ``count`` hinted positions after the farthest read (unread ones)."""
        out: list[str] = []
        pos = max(self.frontier, self.cursor)
        while pos < len(self._hint) and len(out) < count:
            if pos not in self._ahead:
                out.append(self._hint[pos])
            pos += 1
        return out

    def next_use(self, digest: str) -> int:
        """Position of ``digest``'s next unread hinted read, or :data:`NEVER`."""
        positions = self._positions.get(digest)
        if not positions:
            return NEVER
        i = bisect_left(positions, self.cursor)
        while i < len(positions) and positions[i] in self._ahead:
            i += 1
        return positions[i] if i < len(positions) else NEVER

    def observe(self, digest: str) -> bool:
        """The job read ``digest`` (hit or miss): move the cursor. Returns whether it counted.

        A read counts for the block's next unread hinted position if that lies within
        ``tolerance`` of the farthest read so far. A report that repeats a read (several
        FUSE reads of one block, a hit reported again) is recognised because far fewer reads
        happened since the block's last counted read than the hint puts between the two.
        """
        pos = self.next_use(digest)
        if pos >= max(self.frontier, self.cursor) + self.tolerance:
            return False  # not planned here (NEVER included)
        last = self._last.get(digest)
        if last is not None and self._reads - last[1] < (pos - last[0]) // 2:
            return False
        self._reads += 1
        self._last[digest] = (pos, self._reads)
        self._ahead.add(pos)
        self.frontier = max(self.frontier, pos + 1)
        if self.in_use:
            self._recent[digest] = None
            self._recent.move_to_end(digest)
            while len(self._recent) > self.in_use:
                old, _ = self._recent.popitem(last=False)
                self._refresh(old)
        self._refresh(digest)
        self._advance()
        return True

    def _advance(self) -> None:
        while True:
            if self.cursor in self._ahead:
                self._ahead.remove(self.cursor)
                self.cursor += 1
            elif self.frontier - self.cursor > self.tolerance:  # a read never reported
                skipped = self._hint[self.cursor]
                self._last[skipped] = (self.cursor, self._reads)
                self.cursor += 1
                self._refresh(skipped)
            else:
                return

    def _rebase(self, offset: int) -> None:
        self._hint = self._hint[offset:]
        self._positions = {}
        for pos, digest in enumerate(self._hint):
            self._positions.setdefault(digest, []).append(pos)
        self.cursor -= offset
        self.frontier -= offset
        self._ahead = {p - offset for p in self._ahead}
        self._last = {d: (p - offset, n) for d, (p, n) in self._last.items()}

    # -- next-use bookkeeping ---------------------------------------------------------------

    def _refresh(self, digest: str) -> None:
        """Recompute a resident block's next use (no-op for blocks not resident)."""
        if digest not in self.inner:
            return
        nxt = self.next_use(digest) if self._hint else NEVER
        if digest in self._recent:
            nxt = -1  # being read now
        if nxt == NEVER:
            self._next.pop(digest, None)
            if digest not in self._never:
                self._never[digest] = None
            return
        self._never.pop(digest, None)
        if self._next.get(digest) != nxt:
            self._next[digest] = nxt
            heapq.heappush(self._heap, (-nxt, next(self._seq), digest))

    def _recompute_all(self) -> None:
        self._next.clear()
        self._heap.clear()
        self._never = OrderedDict()
        for digest in self.inner.resident():  # the wrapped policy's victim order
            self._refresh(digest)

    # -- EvictionPolicy ----------------------------------------------------------------------

    def resize(self, capacity_bytes: int) -> None:
        """Resize the wrapped policy too."""
        super().resize(capacity_bytes)
        self.inner.resize(capacity_bytes)

    def __contains__(self, key: object) -> bool:
        return key in self.inner

    def __len__(self) -> int:
        return len(self.inner)

    def insert(self, key: str, size: int) -> None:
        """Admit ``key`` in the wrapped policy and place it by its next hinted use."""
        self.inner.insert(key, size)
        self.used_bytes = self.inner.used_bytes
        if self._hint:
            self._refresh(key)
            if key in self._never:
                self._never.move_to_end(key)

    def access(self, key: str) -> None:
        """A hit (recency for the wrapped policy). Reads move the cursor via :meth:`observe`."""
        self.inner.access(key)
        if key in self._never:
            self._never.move_to_end(key)

    def remove(self, key: str) -> int:
        """Forget ``key`` here and in the wrapped policy."""
        self._next.pop(key, None)
        self._never.pop(key, None)
        size = self.inner.remove(key)
        self.used_bytes = self.inner.used_bytes
        return size

    def pop_victim(self, exclude: Iterable[str] = ()) -> tuple[str, int] | None:
        """Without a hint, the wrapped policy's victim. With one: a block the hint does not
        read again (least recently used first), else the one whose next read is farthest."""
        if not self._hint:
            victim = self.inner.pop_victim(exclude)
            self.used_bytes = self.inner.used_bytes
            return victim
        skip = set(exclude)
        key = next((k for k in self._never if k not in skip), None)
        if key is None:
            key = self._pop_farthest(skip)
        if key is None:
            return None
        return key, self.remove(key)

    def _pop_farthest(self, skip: set[str]) -> str | None:
        held: list[tuple[int, int, str]] = []
        found: str | None = None
        while self._heap:
            entry = heapq.heappop(self._heap)
            neg, _, digest = entry
            if self._next.get(digest) != -neg:
                continue  # stale
            if digest in skip:
                held.append(entry)
                continue
            found = digest
            break
        for entry in held:
            heapq.heappush(self._heap, entry)
        return found

    def resident(self) -> list[str]:
        """Resident keys, the next victim first (by the hint when one is installed)."""
        if not self._hint:
            return self.inner.resident()
        hinted = sorted(self._next, key=lambda d: -self._next[d])
        return [*self._never, *hinted]

    def check_invariants(self) -> None:
        """The wrapped policy's invariants; every resident key is placed exactly once."""
        self.inner.check_invariants()
        assert self.used_bytes == self.inner.used_bytes, "used_bytes out of sync"
        if not self._hint:
            return
        resident = set(self.inner.resident())
        assert set(self._next).isdisjoint(self._never), "a key both hinted and never"
        assert set(self._next) | set(self._never) == resident, "placement out of sync"
        for digest, nxt in self._next.items():
            want = -1 if digest in self._recent else self.next_use(digest)
            assert nxt == want != NEVER, f"stale next use of {digest}"
        assert all(p >= self.cursor for p in self._ahead), "read position behind cursor"
        assert self.cursor <= max(self.frontier, self.cursor) <= len(self._hint)


@dataclass(frozen=True)
class HintStatus:
    """What ``POST /v1/hints`` installed."""

    blocks: int
    hint_length: int
    cursor: int
    prefetching: int


class HintService:
    """Installs hints in the cache's :class:`HintedPolicy` and prefetches ahead of reads.

    Args:
        cache: its policy must be a :class:`HintedPolicy`.
        fetcher: prefetches through :meth:`spoke.fetcher.Fetcher.prefetch`.
        window_bytes: how far ahead of the farthest observed read to keep prefetched; at
            most half the cache, so prefetched blocks never crowd out the ones being read.
    """

    def __init__(self, cache: BlockCache, fetcher: Fetcher, window_bytes: int = 64 << 20) -> None:
        if not isinstance(cache.policy, HintedPolicy):
            raise TypeError("hints need the cache's policy to be a HintedPolicy")
        self.policy: HintedPolicy = cache.policy
        self.cache = cache
        self.fetcher = fetcher
        self.window_bytes = max(0, min(window_bytes, cache.capacity_bytes // 2))
        self._sizes: dict[str, int] = {}

    def install(self, blocks: Sequence[tuple[str, int]], append: bool = False) -> HintStatus:
        """Make ``(digest, size)`` in read order the hint and start prefetching its head."""
        if not append or not self.policy.active:
            self._sizes = {}
        for digest, size in blocks:
            self._sizes[digest] = size
        self.policy.set_hint([d for d, _ in blocks], append=append)
        log.info(
            "hint: %d blocks installed (%s), %d hinted positions ahead",
            len(blocks),
            "appended" if append else "replaced",
            self.policy.hint_length - self.policy.cursor,
        )
        return HintStatus(
            blocks=len(blocks),
            hint_length=self.policy.hint_length,
            cursor=self.policy.cursor,
            prefetching=self.prefetch_ahead(),
        )

    def observe(self, digests: Iterable[str]) -> None:
        """The mount read these blocks: move the cursor and top up the prefetch window."""
        if not self.policy.active:
            return
        moved = False
        for digest in digests:
            moved = self.policy.observe(digest) or moved
        if moved:
            self.prefetch_ahead()

    def prefetch_ahead(self) -> int:
        """Start fetching the window after the farthest read; returns fetches started."""
        window: list[tuple[str, int]] = []
        total = 0
        seen: set[str] = set()
        for digest in self.policy.upcoming(max(1, self.window_bytes // 4096)):
            size = self._sizes.get(digest, 0)
            if total + size > self.window_bytes:
                break
            total += size
            if digest not in seen:
                seen.add(digest)
                window.append((digest, size))
        return self.fetcher.prefetch(window) if window else 0
