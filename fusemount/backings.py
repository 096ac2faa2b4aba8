"""The backing ids a mount registered: each inode's id and handle counts, the idle ids and
their bounds, the checks that an id's block file is still linked, closing ids, and keeping
all of it in step with the other workers through the backing ledger. Which opens go
passthrough, and the kernel's rules for them, are :mod:`fusemount.passthrough`'s.

When the inode's last passthrough handle is released its backing id stays registered,
*idle*, for the next open of the inode (:data:`IDLE_IDS` at most, least recently released
closed first). The :data:`IDLE_BACKINGS` most recently released keep this process's
descriptor of their block file: a re-open is then a dictionary look-up, with no thread
hop, no ``BACKING_OPEN`` and, but once per :data:`RECHECK_S`, no ``fstat``; its release a
counter. Older idle ids give their descriptor up (the open-file limit bounds those, not
the ids) and keep the block file's device and inode number instead: their re-open opens
the block file by its path on the loop and checks it is the same file (one ``open`` and
one ``fstat``, no thread hop, no registration). So a snapshot of up to :data:`IDLE_IDS`
cached one-block files never pays a registration twice, whatever the open-file limit.
An idle id is closed when its block file is found unlinked (evicted or replaced: checked
at the re-open, and :meth:`Backings.sweep` looks at a slice of the idle ids every half
second: an ``fstat``, or a ``stat`` of the path for one without a descriptor), when its
snapshot is revoked, or when passthrough is turned off. Files already open keep the
kernel's own reference to the block file, so closing an id does not end them — revocation
does that by truncating the block file (:meth:`fusemount.passthrough.Passthrough.revoke`
for evicted ones, the daemon's purge for the rest: fusemount/DESIGN.md).

Several mount workers serving one connection share every inode's backing id and handle
counts through the backing ledger (:mod:`fusemount.ledger`): each change is a
read-decide-write of the inode's slot under the ledger's lock, so a worker shares the id
another registered (a second one would fail the open: EBUSY) and any worker may close an
id that is idle. What a worker keeps of its own — its descriptor of each block file, for
the linked checks, and its least-recently-released order of idle ids — is a cache of the
ledger, brought up to date from the slot at every change (:meth:`Backings._load`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import trio

from fusemount.ledger import BackingLedger, LedgerRecord

log = logging.getLogger(__name__)

IDLE_BACKINGS = 16384
"""Most idle backing ids that keep their descriptor of the block file (and at most half
the mount's open-file limit: ``fusemount.cli.idle_backings``): their re-open is a look-up."""

ACTIVE_BACKINGS = 16384
"""Most inodes with passthrough handles open at once (each keeps this process's descriptor
of its block file, for a revocation's truncation), and at most a quarter of the mount's
open-file limit (``fusemount.cli.active_backings``); further inodes open on the pyfuse3
path, whose block files share a bounded table. Unbounded, one user holding opens of
20,000 one-block files took every descriptor of a mount whose limit was 20,000, and every
other reader's open failed EIO (issue 39's seventeenth probe)."""

IDLE_IDS = 131072
"""Most backing ids kept registered after their inode's last release, for its next open.
Each holds the kernel's reference to its block file (about 1 KiB of kernel memory with the
block file's inode and dentry: 128 MiB for all) and about 200 bytes here, and keeps an
evicted block's disk space until it is found unlinked (:data:`SWEEP_SLICE`). Shuffled
opens of more files than this mostly miss it (least recently released go first)."""

RECHECK_S = 0.1
"""An idle id is re-checked (one ``fstat``: unlinked means evicted or replaced) at a
re-open when its last check is older than this, seconds (``BlockFiles.recheck_after``)."""

SWEEP_SLICE = 1024
"""Idle ids :meth:`Backings.sweep` checks per call, every 0.5 s (one ``fstat``, or a
``stat`` of the path, each: about 2-4 ms on the loop): 131,072 in about a minute."""


_UNLOCKED = contextlib.nullcontext()  # reusable and re-entrant


@dataclass
class Backing:
    """One inode's registered backing id (shared by its passthrough handles, or idle)."""

    backing_id: int
    digest: str
    snapshot_id: str
    fd: int  # our own descriptor of the block file (for a revocation's truncation); -1: none
    handles: int = 1  # 0: idle, kept for the inode's next open
    checked: float = 0.0  # monotonic time its block file was last seen linked
    ident: tuple[int, int] = (0, 0)  # the block file's device and inode ((0, 0): unknown)


class Backings:
    """The registered backing ids and their upkeep: the base of
    :class:`fusemount.passthrough.Passthrough`, which decides what is registered.

    Sixteen methods: the ledger sync (``_locked``, ``_load``, ``_record``, ``_forget``,
    ``adopt``, ``reconcile``), the idle bounds and sweep (``_trim``, ``_drop_fd``,
    ``_close_idle``, ``sweep``, ``sweep_forever``), closing (``_close``) and the counters
    share one inode table and one lock rule, so they stay one class.

    All methods run on the event loop. Args: as :class:`~fusemount.passthrough.Passthrough`'s
    of the same names.
    """

    def __init__(
        self,
        close_backing: Callable[[int], None] | None = None,
        idle_max: int = IDLE_BACKINGS,
        idle_ids: int = IDLE_IDS,
        clock: Callable[[], float] = time.monotonic,
        ledger: BackingLedger | None = None,
        block_path: Callable[[str], Path] | None = None,
        exclusive: bool = True,
        snapshot_of: Callable[[int], str] | None = None,
    ) -> None:
        self.ledger = ledger
        self.exclusive = exclusive
        self._block_path = block_path
        self._snapshot_of = snapshot_of or (lambda inode: "")
        self.idle_max = idle_max
        self.idle_ids = max(idle_ids, idle_max)
        self._clock = clock
        self._idle: OrderedDict[int, None] = OrderedDict()  # idle inodes, oldest first
        self._idle_fds: OrderedDict[int, None] = OrderedDict()  # of those, with a descriptor
        self._sweep_at = 0  # where the next sweep's slice of the idle ids starts
        self._reconcile_at = 0  # where the next reconcile's slice starts
        self._close_backing = close_backing
        self._backings: dict[int, Backing] = {}  # inode -> its backing id
        self._cached: dict[int, int] = {}  # inode -> handles open on the pyfuse3 path

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        """The ledger's lock (nothing when this process serves the connection alone: a
        shared no-op, so an open or release alone builds no generator)."""
        if self.ledger is None or self.exclusive:
            return _UNLOCKED
        return self.ledger.locked()

    def _load(self, inode: int, snapshot_id: str = "", adopting: bool = False) -> None:
        """Bring this process's view of ``inode`` up to date from its ledger slot (another
        worker may have opened, released, registered or closed since); under the lock.
        Serving alone, this process's view is the ledger's (written through by
        :meth:`_record`), so there is nothing to read but at adoption."""
        if self.ledger is None or (self.exclusive and not adopting):
            return
        slot = self.ledger.get(inode)
        if slot.cached:
            self._cached[inode] = slot.cached
        else:
            self._cached.pop(inode, None)
        mine = self._backings.get(inode)
        if mine is not None and mine.backing_id != slot.backing_id:
            self._forget(inode)  # closed (and perhaps registered anew) by another worker
            mine = None
        if not slot.backing_id:
            return
        if mine is None:
            fd = self._open_block(slot.digest)
            snapshot_id = snapshot_id or self._snapshot_of(inode)
            mine = self._backings[inode] = Backing(
                slot.backing_id, slot.digest, snapshot_id, fd, handles=slot.handles,
                checked=self._clock() if fd >= 0 else 0.0,  # gone: re-checked at once
                ident=ident(fd),
            )  # fmt: skip
        mine.handles = slot.handles
        if snapshot_id and not mine.snapshot_id:
            mine.snapshot_id = snapshot_id
        if mine.handles > 0:
            self._idle.pop(inode, None)
            self._idle_fds.pop(inode, None)
        elif inode not in self._idle:
            self._idle[inode] = None  # idle: any worker may close it
            if mine.fd >= 0:
                self._idle_fds[inode] = None

    def _open_block(self, digest: str) -> int:
        """Our descriptor of ``digest``'s block file, for the linked checks (-1: gone)."""
        if self._block_path is None:
            return -1
        try:
            return os.open(self._block_path(digest), os.O_RDONLY | os.O_CLOEXEC)
        except (OSError, ValueError):
            return -1  # evicted since: never shared again once idle

    def _forget(self, inode: int) -> None:
        """Drop this process's view of a backing id that is no longer ``inode``'s."""
        backing = self._backings.pop(inode)
        self._idle.pop(inode, None)
        self._idle_fds.pop(inode, None)
        if backing.fd >= 0:
            os.close(backing.fd)

    def _close_idle(self, inode: int) -> None:
        """Close ``inode``'s backing id if it is still idle (another worker may have
        opened it since); else only forget it as idle here."""
        with self._locked():
            self._load(inode)
            backing = self._backings.get(inode)
            if backing is not None and backing.handles <= 0:
                self._close(inode)
            else:
                self._idle.pop(inode, None)
                self._idle_fds.pop(inode, None)

    def _close(self, inode: int) -> None:
        """Close ``inode``'s backing id and our descriptor of its block file."""
        backing = self._backings.pop(inode)
        self._idle.pop(inode, None)
        self._idle_fds.pop(inode, None)
        self._record(inode)
        if backing.fd >= 0:
            os.close(backing.fd)
        if self._close_backing is not None:
            try:
                self._close_backing(backing.backing_id)
            except OSError as err:  # the kernel dropped it already (connection gone)
                log.debug("closing backing id %d: %s", backing.backing_id, err)

    def _record(self, inode: int) -> None:
        """Write ``inode``'s state to the ledger (its slot freed when nothing is left)."""
        if self.ledger is None:
            return
        backing, cached = self._backings.get(inode), self._cached.get(inode, 0)
        if backing is None and not cached:
            self.ledger.drop(inode)
        elif backing is None:
            self.ledger.put(inode, 0, 0, cached, "")
        else:
            self.ledger.put(inode, backing.backing_id, backing.handles, cached, backing.digest)

    def _trim(self) -> None:
        """Keep the idle ids within their bounds: the oldest beyond :attr:`idle_max` give
        up their descriptor, the oldest beyond :attr:`idle_ids` are closed."""
        while len(self._idle_fds) > self.idle_max:
            self._drop_fd(next(iter(self._idle_fds)))
        while len(self._idle) > self.idle_ids:
            self._close_idle(next(iter(self._idle)))

    def _drop_fd(self, inode: int) -> None:
        """An idle id gives up our descriptor of its block file (keeping its identity);
        one whose identity is unknown is closed instead."""
        self._idle_fds.pop(inode, None)
        backing = self._backings.get(inode)
        if backing is None or backing.handles > 0 or backing.fd < 0:
            return
        if backing.ident == (0, 0) or self._block_path is None:
            self._close_idle(inode)
            return
        os.close(backing.fd)
        backing.fd = -1

    def adopt(self, records: Iterable[LedgerRecord]) -> int:
        """Take over the backing ids and handle counts the processes before this one on
        this FUSE connection left (:meth:`BackingLedger.records`), before serving its first
        request. An adopted id is shared by the inode's next opens and closed as any other
        once its handles are released; its block file is opened again by digest for the
        checks that it is still linked (gone: closed at its last release).
        Returns how many backing ids were adopted."""
        adopted = 0
        for r in records:
            with self._locked():
                self._load(r.inode, adopting=True)
            adopted += r.backing_id > 0
        self._trim()
        return adopted

    def _linked(self, backing: Backing) -> bool:
        """Whether the backing's block file is still in the cache (not unlinked): by our
        descriptor, or for an idle id without one, by its path (the same file)."""
        try:
            if backing.fd >= 0:
                return os.fstat(backing.fd).st_nlink > 0
            if self._block_path is None or backing.ident == (0, 0):
                return False
            found = os.stat(self._block_path(backing.digest))
        except (OSError, ValueError):
            return False
        return (found.st_dev, found.st_ino) == backing.ident

    def _reopen(self, backing: Backing) -> bool:
        """Open an idle id's block file by its path again, for an open that takes the id
        (its reads may need a revocation's truncation): True if it is the same file,
        linked, and ``backing.fd`` is its descriptor now."""
        if self._block_path is None or backing.ident == (0, 0):
            return False
        try:
            fd = os.open(self._block_path(backing.digest), os.O_RDONLY | os.O_CLOEXEC)
        except (OSError, ValueError):
            return False
        try:
            found = os.fstat(fd)
        except OSError:
            found = None
        if found is None or found.st_nlink == 0 or (found.st_dev, found.st_ino) != backing.ident:
            os.close(fd)
            return False
        backing.fd = fd
        return True

    def sweep(self, count: int = SWEEP_SLICE) -> int:
        """Check ``count`` idle ids (the next slice, round robin) and close those whose
        block file was unlinked (evicted or replaced), so that they free its disk space.
        On the loop: one ``fstat`` of an open descriptor each. Returns how many closed."""
        idle = list(self._idle)
        if self._sweep_at >= len(idle):
            self._sweep_at = 0
        now, closed = self._clock(), 0
        for inode in idle[self._sweep_at : self._sweep_at + count]:
            backing = self._backings.get(inode)
            if backing is not None and self._linked(backing):
                backing.checked = now
            else:
                self._close_idle(inode)
                closed += 1
        self._sweep_at += count - closed
        return closed

    def reconcile(self, count: int = SWEEP_SLICE) -> int:
        """With other workers: forget ``count`` of this process's backings (the next
        slice, round robin) whose id another worker has closed since we last looked, so
        that our descriptor of the block file does not keep an evicted block's disk space.
        One read of the mapped slot each. Returns how many were forgotten."""
        if self.ledger is None or self.exclusive:
            return 0
        inodes = list(self._backings)
        if self._reconcile_at >= len(inodes):
            self._reconcile_at = 0
        gone = [
            inode
            for inode in inodes[self._reconcile_at : self._reconcile_at + count]
            if self.ledger.get(inode).backing_id != self._backings[inode].backing_id
        ]
        for inode in gone:
            with self._locked():
                self._load(inode)
        self._reconcile_at += count - len(gone)
        return len(gone)

    async def sweep_forever(self, every: float = 0.5) -> None:
        """:meth:`sweep` (and :meth:`reconcile`) every ``every`` seconds until cancelled."""
        while True:
            await trio.sleep(every)
            if self._idle:
                self.sweep()
            if self._backings:
                self.reconcile()

    @property
    def backing_ids(self) -> int:
        """Backing ids registered now: one per inode open in passthrough mode, and the
        idle ones (:attr:`idle_backing_ids`)."""
        return len(self._backings)

    @property
    def idle_backing_ids(self) -> int:
        """Backing ids registered for no open file, kept for their inode's next open."""
        return len(self._idle)

    @property
    def descriptors(self) -> int:
        """This process's descriptors of block files (one per backing id that keeps one)."""
        return sum(1 for b in self._backings.values() if b.fd >= 0)


def ident(fd: int) -> tuple[int, int]:
    """The device and inode number of the file ``fd`` ((0, 0): none, or unknown)."""
    if fd < 0:
        return (0, 0)
    try:
        found = os.fstat(fd)
    except OSError:
        return (0, 0)
    return (found.st_dev, found.st_ino)
