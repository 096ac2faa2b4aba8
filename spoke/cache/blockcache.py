"""The block cache: block store + eviction policy + pins + watermarks.

Runs on the daemon's event loop; block file writes go to worker threads, batched: writes
that queue up while one batch is being written go together in the next, one thread
hand-off and one index commit per batch (:class:`~spoke.cache.writer.BlockWriter`). Capacity rules:

* Above the **high watermark** (default 95 % of ``--cache-size``) a background task evicts
  down to the **low watermark** (default 90 %), so admissions rarely wait and reads never
  do (the mount reads hits without the daemon). Not while the policy evicts on demand
  (a read-order hint is installed): then admissions evict exactly what they need.
* The cache never holds more than ``--cache-size``, counting the blocks being written:
  an admission that would cross it evicts synchronously, before its write and again
  after it (other admissions may have landed meanwhile).
* **Pinned** blocks are taken out of the policy while pinned, so they are never victims;
  the policy's capacity is what pins leave over.
* When the cache filesystem is full (``ENOSPC``) the cache evicts until the write fits; if
  nothing can be evicted it raises :class:`CacheFull` and the caller streams the block
  through without caching it. So it does when the room within ``--cache-size`` is taken
  by pins (or blocks readers wait for): a block is never admitted only to be evicted by
  the next admission before its reader gets to it.
* A block fetched **ahead of its readers** (:class:`Placement`) goes to the policy's cold
  end, unread (``insert(..., prefetched=True)``): an admission that needs room takes it
  before anything the policy ranks. The watermarks count only the blocks the policy ranks
  (:attr:`BlockCache.ranked_bytes`), so the background evictor neither makes room for
  prefetches nor takes them before their reader comes: prefetch lives in the room left
  free. Readahead and fill are admitted only into that room and never evict
  (:class:`PrefetchRefused` otherwise: the cache is under pressure); readahead is asked
  for only while it fits above the high watermark (:attr:`BlockCache.readahead_room`),
  fill only below it (:mod:`spoke.prefetch.fill`); a hinted prefetch may take the room of a block
  its hint reads later (the hinted policy chose it).

How a block is placed and refused is :mod:`spoke.cache.admission`'s; the hits' recency on
its way to the index, :mod:`spoke.cache.recency`'s.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from collections.abc import Callable, Iterable

from spoke import metrics
from spoke.cache.admission import CacheFull, Placement, PrefetchRefused
from spoke.cache.arc import ARCPolicy
from spoke.cache.policy import EvictionPolicy
from spoke.cache.recency import PendingRecency
from spoke.cache.staging import Staged
from spoke.cache.store import BlockStore, Received
from spoke.cache.tenants import Keeper, TenantShares
from spoke.cache.writer import BlockWriter

log = logging.getLogger(__name__)

EVICT_BATCH = 64  # victims per background step before yielding the loop


class BlockCache:
    """Cached blocks, their recency, pins, and eviction to stay within ``capacity_bytes``.

    Its two dozen methods are one concern, the byte accounting of the resident blocks: each reads
    or changes the same totals (the bytes the policy ranks, the unread prefetched bytes,
    the pinned bytes, the bytes being written) under one rule (they never pass the
    capacity), so admission, pins and the background evictor stay together; the parts
    with a concern of their own are elsewhere (the order of victims in the policy, the
    block writes in :class:`~spoke.cache.writer.BlockWriter`, the files and index in
    :class:`~spoke.cache.store.BlockStore`).

    Args:
        store: block files and index; recovered (stray temp files removed) on construction.
        policy: decides eviction order; rebuilt from the index's recency ticks.
        capacity_bytes: the most block bytes kept on disk (``--cache-size``).
        high_watermark, low_watermark: fractions of capacity that start and stop background
            eviction (``0 < low <= high <= 1``).

    Raises:
        ValueError: non-positive capacity or inconsistent watermarks.
    """

    def __init__(
        self,
        store: BlockStore,
        policy: EvictionPolicy,
        capacity_bytes: int,
        high_watermark: float = 0.95,
        low_watermark: float = 0.90,
    ) -> None:
        if capacity_bytes <= 0:
            raise ValueError("cache capacity must be positive")
        if not 0 < low_watermark <= high_watermark <= 1:
            raise ValueError("watermarks must satisfy 0 < low <= high <= 1")
        self.store = store
        self.writer = BlockWriter(store)
        self.policy = policy
        self.capacity_bytes = capacity_bytes
        self.high_bytes = int(capacity_bytes * high_watermark)
        self.low_bytes = int(capacity_bytes * low_watermark)
        self._pinned: dict[str, int] = {}  # resident pinned digest -> size
        self._pin_refs: dict[str, int] = {}  # digest -> number of pins holding it
        self._tick = 0
        self._recency = PendingRecency(store)  # recency ticks not yet in the index
        self._reserved = 0  # bytes of admissions being written
        self._landed: asyncio.Event | None = None  # set when an admission's write ends
        self._wake: asyncio.Event | None = None
        self.on_evict: list[Callable[[str, int], None]] = []  # called per evicted block
        self.tenants: TenantShares | None = None  # tenants' shares (share_with)
        policy.resize(capacity_bytes)
        for block in store.recover():
            policy.insert(block.digest, block.size)
            self._tick = max(self._tick, block.tick)
        metrics.CACHE_CAPACITY_BYTES.set(capacity_bytes)
        self._evict_down_to(capacity_bytes)
        self._update_gauges()
        log.info(
            "cache: %d blocks, %d of %d bytes recovered (policy %s)",
            len(policy),
            policy.used_bytes,
            capacity_bytes,
            policy.name,
        )

    def share_with(self, tenants: TenantShares) -> None:
        """From now on, evictions keep every tenant's share (:mod:`spoke.cache.tenants`);
        the resident blocks are attributed to their tenants now."""
        self.tenants = tenants
        sizes = {d: self.policy.size_of(d) for d in self.policy.resident()}
        tenants.restore(sizes | self._pinned)

    # -- queries -------------------------------------------------------------------------

    def contains(self, digest: str) -> bool:
        """True when ``digest`` is resident (pinned or not)."""
        return digest in self.policy or digest in self._pinned

    def __len__(self) -> int:
        return len(self.policy) + len(self._pinned)

    def resident(self) -> list[str]:
        """Every resident digest, pinned ones last."""
        return [*self.policy.resident(), *self._pinned]

    @property
    def used_bytes(self) -> int:
        """Bytes of resident blocks, pinned included."""
        return self.policy.used_bytes + self.pinned_bytes

    @property
    def free_bytes(self) -> int:
        """Bytes an admission can take without evicting (admissions being written count)."""
        return self.capacity_bytes - self.used_bytes - self._reserved

    @property
    def pinned_bytes(self) -> int:
        """Bytes of resident pinned blocks."""
        return sum(self._pinned.values())

    # -- admission and access ---------------------------------------------------------

    async def admit(
        self,
        digest: str,
        data: Received,
        placement: Placement = Placement.DEMAND,
        urgent: bool = False,
    ) -> None:
        """Write a verified block to disk (or rename its staged file into place,
        :mod:`spoke.cache.staging`) and account for it; ``urgent`` (a reader waits for it)
        writes it in the writer's urgent lane (:class:`~spoke.cache.writer.BlockWriter`).

        The block is written only when it fits within ``capacity_bytes`` next to the
        resident blocks and the admissions being written, after evicting what the policy
        allows; pinned blocks are never evicted for it, so when pins fill the cache it is
        refused (the caller streams it through) instead of being admitted and evicted at
        once by the next admission. A block placed :attr:`Placement.AHEAD` evicts nothing:
        it needs free room (:attr:`prefetch_room`).

        Raises:
            PrefetchRefused: an ``AHEAD`` block and no free room; nothing was written.
                (On every error a staged block's temporary file is left to the caller.)
            CacheFull: no room within the cache size or on the filesystem, and nothing
                evictable (everything pinned or held); nothing was written.
            OSError: another write failure; the cache is unchanged.
        """
        if self.contains(digest):
            if isinstance(data, Staged):
                data.discard()
            return
        size = len(data)
        if placement is Placement.AHEAD and size > self.prefetch_room:
            raise PrefetchRefused(
                errno.ENOSPC, f"no room below the high watermark for prefetched {digest}"
            )
        keep = self._keeper(digest)  # other tenants' shares (one attribution per admission)
        await self._make_room(digest, size, wait=True, keep=keep)
        self._reserved += size
        self._tick += 1
        self._recency.forget(digest)  # its admission's tick is newer
        try:
            while True:
                try:
                    await self.writer.write(digest, data, self._tick, urgent)
                    break
                except OSError as err:
                    if err.errno not in (errno.ENOSPC, errno.EDQUOT):
                        raise
                    if not self._evict_bytes(2 * size):
                        raise self._full(digest, "cache filesystem full") from err
                    log.warning("cache filesystem full: evicted to make room for %s", digest)
        finally:
            self._reserved -= size
            landed, self._landed = self._landed, None
            if landed is not None:
                landed.set()
        # pins taken meanwhile may have shrunk the evictable room: make it again (the
        # block is not in the policy yet, so it is never its own victim), or give it up
        try:
            await self._make_room(digest, size, wait=False, keep=keep)
        except CacheFull:
            self.store.delete(digest)
            raise
        if self.tenants is not None and keep is not None:
            self.tenants.admitted(digest, size, keep.tenant)
        if digest in self._pin_refs:
            self._pinned[digest] = size
            self._resize_policy()
        else:
            self.policy.insert(digest, size, prefetched=placement is not Placement.DEMAND)
        self._update_gauges()
        self._wake_evictor()

    @property
    def prefetch_room(self) -> int:
        """Bytes that resident blocks and admissions being written leave free within the
        cache size: what a block fetched ahead may take without evicting anything."""
        return self.capacity_bytes - self.used_bytes - self._reserved

    @property
    def readahead_room(self) -> int:
        """The part of :attr:`prefetch_room` above the high watermark (and above the
        ranked blocks, when they are over it): readahead there never collides with the
        blocks the policy ranks growing up to the watermark before the evictor trims
        them, so a demand miss does not have to evict a readahead block its reader is
        about to read."""
        ranked = max(self.ranked_bytes, self.high_bytes)
        return self.capacity_bytes - ranked - self.policy.unread_bytes - self._reserved

    async def _make_room(
        self, digest: str, size: int, wait: bool, keep: Keeper | None = None
    ) -> None:
        """Evict until ``size`` more bytes fit next to the residents and the admissions
        being written (the hard limit), passing over what ``keep`` keeps (other tenants'
        shares). When only admissions being written are in the way, wait (``wait``) for
        one to land: it is then evictable like any other block.

        Raises:
            CacheFull: they cannot fit: what is left is pinned, held by readers, or other
                tenants' shares.
        """
        while True:
            if self.pinned_bytes + self._reserved + size <= self.capacity_bytes:
                self._evict_down_to(self.capacity_bytes - self._reserved - size, keep)
                if self.used_bytes + self._reserved + size <= self.capacity_bytes:
                    return
            if not wait or not self._reserved or self.pinned_bytes + size > self.capacity_bytes:
                raise self._full(digest, f"cache of {self.capacity_bytes:,} bytes full")
            if self._landed is None:
                self._landed = asyncio.Event()
            await self._landed.wait()

    @staticmethod
    def _full(digest: str, why: str) -> CacheFull:
        metrics.CACHE_FULL.inc()
        return CacheFull(errno.ENOSPC, f"{why} and nothing evictable ({digest})")

    def record_access(self, digests: Iterable[str]) -> int:
        """Apply a batch of hits to the policy and persist their recency.

        Returns:
            How many of ``digests`` were resident.
        """
        ticks: dict[str, int] = {}
        for digest in digests:
            if self.contains(digest):
                self.policy.access(digest)
                self._tick += 1
                ticks[digest] = self._tick
        if ticks:
            self._recency.add(ticks)
        return len(ticks)

    def flush_recency(self) -> None:
        """Write the hits' recency ticks gathered since the last flush to the index, in one
        transaction (the daemon calls it at close; :meth:`record_access` once a second)."""
        self._recency.flush()

    def drop(self, digest: str) -> bool:
        """Delete a block now (corrupt, or purged); returns whether it was resident."""
        was = self.contains(digest)
        if self.tenants is not None:
            self.tenants.removed(digest)
        self.policy.remove(digest)
        if self._pinned.pop(digest, None) is not None:
            self._resize_policy()
        self.store.delete(digest)
        self._update_gauges()
        return was

    def confirm_resident(self, digests: Iterable[str]) -> int:
        """Drop every one of ``digests`` the index holds whose block file is gone or cannot
        be examined (a failed or replaced cache disk, a file deleted by hand), so that it is
        a miss again and gets refetched; one ``stat`` per resident digest.

        Returns:
            How many were dropped (each counted in ``strata_spoke_lost_blocks_total``).
        """
        lost = 0
        for digest in digests:
            if not self.contains(digest):
                continue
            try:
                os.stat(self.store.layout.block_path(digest))
            except OSError as err:
                log.error("cached block %s is lost from the disk (%s); refetching it", digest, err)
                metrics.LOST_BLOCKS.inc()
                self.drop(digest)
                lost += 1
        return lost

    # -- pins ----------------------------------------------------------------------------

    def pin(self, digests: Iterable[str]) -> None:
        """Hold ``digests`` out of eviction (counted: each pin needs its own unpin)."""
        for digest in digests:
            self._pin_refs[digest] = self._pin_refs.get(digest, 0) + 1
            if digest in self.policy:
                self._pinned[digest] = self.policy.remove(digest)
        self._resize_policy()
        self._update_gauges()

    def unpin(self, digests: Iterable[str]) -> None:
        """Release one pin on each of ``digests``; unpinned resident blocks become evictable."""
        for digest in digests:
            refs = self._pin_refs.get(digest, 0) - 1
            if refs > 0:
                self._pin_refs[digest] = refs
                continue
            self._pin_refs.pop(digest, None)
            size = self._pinned.pop(digest, None)
            if size is not None:
                self.policy.insert(digest, size)
        self._resize_policy()
        self._update_gauges()
        self._wake_evictor()

    def is_pinned(self, digest: str) -> bool:
        """True when some pin holds ``digest``."""
        return digest in self._pin_refs

    # -- eviction ------------------------------------------------------------------------

    @property
    def ranked_bytes(self) -> int:
        """Bytes of resident blocks other than prefetched ones not read yet (those the
        policy ranks, and pinned ones): what the watermarks are about."""
        return self.used_bytes - self.policy.unread_bytes

    async def run_evictor(self) -> None:
        """Background task: when the blocks the policy ranks are above the high
        watermark, evict them down to the low one (not while the policy evicts on demand:
        then admissions evict what they need). Prefetched blocks not read yet are neither
        counted nor taken: they are on their way to a reader, in the room this leaves."""
        self._wake = asyncio.Event()
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self.ranked_bytes > self.low_bytes and not self.policy.evict_on_demand:
                keep = self.tenants.keeper() if self.tenants is not None else None
                if self._evict_batch(self.low_bytes, EVICT_BATCH, True, keep) == 0:
                    break
                await asyncio.sleep(0)  # let fetches and access records in between

    def _wake_evictor(self) -> None:
        if (
            self.ranked_bytes > self.high_bytes
            and self._wake is not None
            and not self.policy.evict_on_demand
        ):
            self._wake.set()

    def _keeper(self, digest: str) -> Keeper | None:
        """What an eviction for ``digest``'s admission keeps: other tenants' shares."""
        return self.tenants.keeper(digest) if self.tenants is not None else None

    def _evict_down_to(self, target: int, keep: Keeper | None = None) -> None:
        while self.used_bytes > max(target, 0):
            if self._evict_batch(target, EVICT_BATCH, keep=keep) == 0:
                return

    def _evict_bytes(self, want: int) -> int:
        """Evict at least ``want`` bytes if the policy has them; returns the bytes freed."""
        before = self.used_bytes
        self._evict_down_to(before - want)
        return before - self.used_bytes

    def _evict_batch(
        self, target: int, most: int, housekeeping: bool = False, keep: Keeper | None = None
    ) -> int:
        """Evict up to ``most`` victims while the cache (``housekeeping``: its ranked
        blocks, unread prefetched ones spared) holds more than ``target`` bytes, passing
        over what ``keep`` keeps."""
        victims: list[tuple[str, int]] = []
        used = self.ranked_bytes if housekeeping else self.used_bytes
        while used > target and len(victims) < most:
            victim = self.policy.pop_victim(spare_unread=housekeeping, keep=keep)
            if victim is None:
                break
            if keep is not None:
                keep.took(*victim)
            victims.append(victim)
            used -= victim[1]
        self._delete_evicted(victims)
        if keep is not None:
            keep.settled()  # the victims' tenants' bytes are down now
        self._update_gauges()
        return len(victims)

    def _delete_evicted(self, victims: list[tuple[str, int]]) -> None:
        if not victims:
            return
        self.store.delete_many([d for d, _ in victims])
        for digest, size in victims:
            if self.tenants is not None:
                self.tenants.removed(digest)
            for hook in self.on_evict:
                hook(digest, size)
        metrics.EVICTIONS.inc(len(victims))
        metrics.EVICTED_BYTES.inc(sum(s for _, s in victims))

    def _resize_policy(self) -> None:
        self.policy.resize(self.capacity_bytes - self.pinned_bytes)

    def _update_gauges(self) -> None:
        metrics.CACHE_USED_BYTES.set(self.used_bytes)
        metrics.CACHE_BLOCKS.set(len(self))
        metrics.PINNED_BYTES.set(self.pinned_bytes)
        policy = getattr(self.policy, "inner", self.policy)  # a HintedPolicy wraps one
        if isinstance(policy, ARCPolicy):
            metrics.ARC_TARGET_BYTES.set(policy.p)
