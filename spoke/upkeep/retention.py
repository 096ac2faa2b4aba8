"""Retention: evict the blocks of snapshots nobody has read for ``--retention`` (e.g. 7d).

Every block read the mount reports (hits in RecordAccess, misses in EnsureBlocks) stamps
the block's last-read time in :class:`ReadClock`. A stored snapshot's last read is the
latest stamp of the blocks only it holds among the stored snapshots (a read of a block
shared with the next version may well be a read of that version), or of all its blocks
when it shares every one; a snapshot whose last read is older than the retention
is *stale*. Each sweep drops the cached blocks of stale snapshots that no fresh snapshot
shares and no pin holds, and writes one audit record per stale snapshot it touched
(``who: daemon``). Manifests stay (they are small and let the snapshot be read again).

The clock is kept in the daemon's LMDB index (database ``readclock``: digest → last
read, f64 seconds), written at each sweep and when the daemon stops, and loaded at
start, so a restart does not reset it. A block with no stamp (never read since it was
cached, or read after the last write before an unclean stop) counts as read at the
daemon's start: a restart never makes anything stale sooner, and a crash loses at most
one sweep interval of stamps (the snapshot then looks that much older).
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Callable, Iterable

import lmdb

from spoke.audit import AuditLog
from spoke.cache.blockcache import BlockCache
from spoke.catalog.catalog import SnapshotCatalog
from spoke.catalog.selection import unique_blocks

log = logging.getLogger(__name__)


_STAMP = struct.Struct(">d")


class ReadClock:
    """Last-read wall time of each cached block, persisted in the index.

    Args:
        now: the clock (seconds; ``time.time`` by default, injectable for tests).
        env: the daemon's LMDB environment (stamps are loaded from and written to its
            ``readclock`` database); None keeps them in memory only.
    """

    def __init__(
        self, now: Callable[[], float] = time.time, env: lmdb.Environment | None = None
    ) -> None:
        self.now = now
        self.started = now()
        self._last: dict[str, float] = {}
        self._dirty: set[str] = set()
        self._env = env
        self._db = env.open_db(b"readclock") if env is not None else None
        if env is not None:
            with env.begin(db=self._db) as txn:
                for key, value in txn.cursor():
                    self._last[key.decode()] = _STAMP.unpack(value)[0]

    def read(self, digests: Iterable[str]) -> None:
        """Stamp ``digests`` as read now."""
        t = self.now()
        for digest in digests:
            self._last[digest] = t
            self._dirty.add(digest)

    def flush(self) -> int:
        """Write the stamps changed since the last flush to the index, in one transaction
        (nothing without an index). Returns how many were written or deleted."""
        if self._env is None or not self._dirty:
            return 0
        dirty, self._dirty = self._dirty, set()
        with self._env.begin(write=True, db=self._db) as txn:
            for digest in dirty:
                stamp = self._last.get(digest)
                if stamp is None:
                    txn.delete(digest.encode())
                else:
                    txn.put(digest.encode(), _STAMP.pack(stamp))
        return len(dirty)

    def last(self, digest: str) -> float:
        """When ``digest`` was last read (the daemon's start if not since)."""
        return self._last.get(digest, self.started)

    def prune(self, cached: Callable[[str], bool]) -> int:
        """Forget the stamps of blocks no longer cached (evicted for room, say); returns
        how many."""
        gone = [d for d in self._last if not cached(d)]
        self.forget(gone)
        return len(gone)

    def forget(self, digests: Iterable[str]) -> None:
        """Drop stamps of blocks no longer cached."""
        for digest in digests:
            if self._last.pop(digest, None) is not None:
                self._dirty.add(digest)


class Retention:
    """Evicts the blocks of snapshots not read for ``retention_s`` seconds.

    Args:
        catalog: the stored snapshots and their manifests.
        cache: whose blocks are dropped.
        clock: the read stamps.
        retention_s: how long a snapshot may go unread, seconds (> 0).
        audit: where evictions are recorded.
    """

    def __init__(
        self,
        catalog: SnapshotCatalog,
        cache: BlockCache,
        clock: ReadClock,
        retention_s: float,
        audit: AuditLog | None = None,
    ) -> None:
        if retention_s <= 0:
            raise ValueError("retention must be positive")
        self.catalog, self.cache, self.clock = catalog, cache, clock
        self.retention_s = retention_s
        self.audit = audit

    def sweep(self) -> int:
        """One pass; returns the number of blocks dropped."""
        now = self.clock.now()
        revoked = self.catalog.revoked_snapshots()
        stale: dict[str, dict[str, int]] = {}
        fresh: set[str] = set()
        stored = {
            sid: unique_blocks(self.catalog.stored_manifest(sid))
            for sid in self.catalog.stored_snapshots()
        }
        holders: dict[str, int] = {}
        for blocks in stored.values():
            for digest in blocks:
                holders[digest] = holders.get(digest, 0) + 1
        for sid, blocks in stored.items():
            # a read of a block only this snapshot has is a read of this snapshot; one of a
            # shared block may be a read of another version, unless all its blocks are shared
            own = [d for d in blocks if holders[d] == 1] or list(blocks)
            last = max((self.clock.last(d) for d in own), default=self.clock.started)
            if sid in revoked or now - last <= self.retention_s:
                fresh.update(blocks)  # revoked ones are purged by invalidation, not here
            else:
                stale[sid] = blocks
        dropped = 0
        for sid, blocks in stale.items():
            doomed = [
                d
                for d in blocks
                if d not in fresh and self.cache.contains(d) and not self.cache.is_pinned(d)
            ]
            count = sum(self.cache.drop(d) for d in doomed)
            self.clock.forget(doomed)
            if count:
                dataset = self.catalog.snapshot_dataset(sid) or "?"
                log.info("retention: %d blocks of %s snapshot %s dropped", count, dataset, sid)
                if self.audit is not None:
                    self.audit.record(
                        who="daemon",
                        what=f"retention evict {dataset} snapshot {sid}",
                        outcome=f"{count} blocks dropped",
                        retention_s=self.retention_s,
                    )
            dropped += count
        return dropped

    async def run(self) -> None:
        """Sweep forever, every tenth of the retention (between 1 s and 5 min)."""
        interval = min(max(self.retention_s / 10, 1.0), 300.0)
        while True:
            await asyncio.sleep(interval)
            try:
                self.sweep()
                self.clock.prune(self.cache.contains)
                self.clock.flush()
            except Exception:  # a sweep must never end the daemon
                log.exception("retention sweep failed")
