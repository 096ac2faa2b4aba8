"""FUSE passthrough: the kernel reads a cached one-block file from its block file itself.

When the kernel (Linux ≥ 6.9, ``CONFIG_FUSE_PASSTHROUGH``), libfuse (≥ 3.17) and pyfuse3
(built by ``make`` with ``native/pyfuse3-passthrough.patch``) allow it, an open of a file
whose bytes are exactly one block — every Zarr chunk is — whose block file is cached and
verified is answered with a *backing id* (``FUSE_DEV_IOC_BACKING_OPEN`` on that file): the
kernel then serves every read of that open file from the block file's page cache, without
a request to this process. Everything else takes the pyfuse3 read path.

Kernel rules this module keeps (``fs/fuse/iomode.c``, ``fs/fuse/passthrough.c``):

* all opens of one FUSE inode at a time are either passthrough, sharing one backing id,
  or not: a passthrough open beside a cached one fails (``ETXTBSY``, the reader sees EIO),
  and so does a second backing file for the same inode. So an inode with handles open on
  the pyfuse3 path gets more of those until they are all released, and one with a backing
  id reuses it;
* ``FOPEN_KEEP_CACHE`` is not allowed with ``FOPEN_PASSTHROUGH`` (EIO at open);
* any open of an inode with a backing file must be passthrough too (else EIO), so an
  ``O_DIRECT`` open — never one to start passthrough: the backing file system would
  impose its alignment rules (EINVAL) where FUSE has none — joins the shared id with
  ``FOPEN_DIRECT_IO``, which the kernel lets override it: its reads come to this process;
* ``BACKING_OPEN`` needs CAP_SYS_ADMIN and a backing file that is not on a stacked file
  system (overlayfs: ``EOPNOTSUPP``); a refused one turns passthrough off, logged once.

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
at the re-open, and :meth:`Passthrough.sweep` looks at a slice of the idle ids every half
second: an ``fstat``, or a ``stat`` of the path for one without a descriptor), when its
snapshot is revoked, or when passthrough is turned off. Files already open keep the
kernel's own reference to the block file, so closing an id does not end them — revocation
does that by truncating the block file (:meth:`Passthrough.revoke` here for evicted ones,
the daemon's purge for the rest: fusemount/DESIGN.md).

Several mount workers serving one connection share every inode's backing id and handle
counts through the backing ledger (:mod:`fusemount.ledger`): each change is a
read-decide-write of the inode's slot under the ledger's lock, so a worker shares the id
another registered (a second one would fail the open: EBUSY) and any worker may close an
id that is idle. What a worker keeps of its own — its descriptor of each block file, for
the linked checks, and its least-recently-released order of idle ids — is a cache of the
ledger, brought up to date from the slot at every change (:meth:`Passthrough._load`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pyfuse3
import trio

from fusemount.ledger import BackingLedger, LedgerRecord
from fusemount.tree import Node

log = logging.getLogger(__name__)

# errnos of BACKING_OPEN that say passthrough cannot work here at all (not this file)
_FATAL = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTTY, errno.EINVAL, errno.ENOSYS}

IDLE_BACKINGS = 16384
"""Most idle backing ids that keep their descriptor of the block file (and at most half
the mount's open-file limit: ``fusemount.cli.idle_backings``): their re-open is a look-up."""

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
"""Idle ids :meth:`Passthrough.sweep` checks per call, every 0.5 s (one ``fstat``, or a
``stat`` of the path, each: about 2-4 ms on the loop): 131,072 in about a minute."""


_UNLOCKED = contextlib.nullcontext()  # reusable and re-entrant


@dataclass
class _Backing:
    backing_id: int
    digest: str
    snapshot_id: str
    fd: int  # our own descriptor of the block file (for a revocation's truncation); -1: none
    handles: int = 1  # 0: idle, kept for the inode's next open
    checked: float = 0.0  # monotonic time its block file was last seen linked
    ident: tuple[int, int] = (0, 0)  # the block file's device and inode ((0, 0): unknown)


class Passthrough:
    """Which opens go passthrough, and the backing ids of the inodes that do.

    All methods run on the event loop (no locks); the only blocking step, opening and
    verifying the block file, is the caller's (in a worker thread) before :meth:`attach`.

    Args:
        reason: why passthrough is off from the start ("" = it may be on).
        open_backing / close_backing: the kernel calls (pyfuse3's by default; tests fake
            them). ``open_backing(fd)`` returns a backing id or raises OSError.
        idle_max: idle backing ids that keep their descriptor (:data:`IDLE_BACKINGS`; 0:
            ids are closed at the last release).
        idle_ids: idle backing ids kept in all (:data:`IDLE_IDS`; at least ``idle_max``).
        clock: monotonic seconds (tests pass their own).
        ledger: where every inode's backing id and handle counts are kept for a process
            that resumes this FUSE connection, and for the other workers serving it
            (:mod:`fusemount.ledger`; None: nowhere, this process alone).
        block_path: a digest's block file (to open one whose id another process
            registered; None: such a backing is never re-checked and goes at its release).
        exclusive: no other worker serves the connection at once (False: revocations
            leave evicted block files to the readers that hold them, see :meth:`revoke`).
        snapshot_of: the snapshot an inode number belongs to (for a backing id taken over
            from the ledger, which keeps no snapshot ids; default: unknown).
    """

    def __init__(
        self,
        reason: str = "",
        open_backing: Callable[[int], int] | None = None,
        close_backing: Callable[[int], None] | None = None,
        idle_max: int = IDLE_BACKINGS,
        idle_ids: int = IDLE_IDS,
        clock: Callable[[], float] = time.monotonic,
        ledger: BackingLedger | None = None,
        block_path: Callable[[str], Path] | None = None,
        exclusive: bool = True,
        snapshot_of: Callable[[int], str] | None = None,
    ) -> None:
        self.reason = reason
        self.ledger = ledger
        self.exclusive = exclusive
        self._block_path = block_path
        self._snapshot_of = snapshot_of or (lambda inode: "")
        self.enabled = not reason
        self.opens = 0  # opens answered with a backing id since start
        self.reuses = 0  # of those, opens that took an idle id (no registration)
        self.truncated = 0  # block files truncated by revocations
        self.idle_max = idle_max
        self.idle_ids = max(idle_ids, idle_max)
        self._clock = clock
        self._idle: OrderedDict[int, None] = OrderedDict()  # idle inodes, oldest first
        self._idle_fds: OrderedDict[int, None] = OrderedDict()  # of those, with a descriptor
        self._sweep_at = 0  # where the next sweep's slice of the idle ids starts
        self._reconcile_at = 0  # where the next reconcile's slice starts
        self._open_backing = open_backing or getattr(pyfuse3, "passthrough_open", None)
        self._close_backing = close_backing or getattr(pyfuse3, "passthrough_close", None)
        self._backings: dict[int, _Backing] = {}  # inode -> its backing id
        self._cached: dict[int, int] = {}  # inode -> handles open on the pyfuse3 path

    def _disable(self, reason: str) -> None:
        if self.enabled:
            log.warning("passthrough off: %s; reads take the pyfuse3 path", reason)
        self.enabled = False
        self.reason = reason
        for inode in list(self._idle):
            self._close_idle(inode)

    def negotiated(self, offered: bool, requested: bool) -> None:
        """Record what FUSE INIT said (pyfuse3's ``passthrough_state()``) and log the
        start-up line saying whether passthrough is on and, if not, why."""
        if self.enabled and not offered:
            self.reason = "the kernel did not offer it (needs Linux >= 6.9, FUSE_PASSTHROUGH)"
        elif self.enabled and not requested:
            self.reason = "not requested at FUSE INIT"
        self.enabled = not self.reason
        if self.enabled:
            log.info("passthrough on: cached one-block files are read by the kernel")
        else:
            log.info("passthrough off: %s", self.reason)

    def candidate(self, inode: int, node: Node) -> str | None:
        """The block digest an open of ``node`` would pass through, or None for the pyfuse3
        path: passthrough off, not exactly one block holding the whole file, or the inode
        already has handles on the pyfuse3 path."""
        if not self.enabled or self._cached.get(inode):
            return None
        if not self.exclusive and self.ledger is not None and self.ledger.get(inode).cached:
            return None  # another worker's (checked again under the lock by attach)
        if len(node.blocks) != 1 or node.blocks[0][1] != node.size or node.size <= 0:
            return None
        return node.blocks[0][0]

    def shared(self, inode: int, counted: bool = True, snapshot_id: str = "") -> int | None:
        """The inode's backing id when it already has one (the new handle shares it, even
        when passthrough was turned off since: the kernel fails a non-passthrough open of
        an inode that has passthrough ones), or an idle one that is still good.

        An idle id is taken only by an open that would start passthrough (``counted``: not
        ``O_DIRECT``), while passthrough is on and no handle of the inode is open on the
        pyfuse3 path; its block file is re-checked (``fstat``) when its last check is
        :data:`RECHECK_S` old, and closed if unlinked (then None: the caller opens it anew).
        """
        with self._locked():
            self._load(inode, snapshot_id)
            return self._share(inode, counted)

    def _share(self, inode: int, counted: bool) -> int | None:
        backing = self._backings.get(inode)
        if backing is None:
            return None
        if not backing.handles:
            if not counted or not self.enabled or self._cached.get(inode):
                return None
            now = self._clock()
            if backing.fd < 0:  # idle without a descriptor: the block file by its path
                if not self._reopen(backing):
                    self._close(inode)
                    return None
                backing.checked = now
            elif now - backing.checked > RECHECK_S:
                if not self._linked(backing):
                    self._close(inode)
                    return None
                backing.checked = now
            self._idle.pop(inode, None)
            self._idle_fds.pop(inode, None)
            self.reuses += 1
        backing.handles += 1
        self._record(inode)
        self.opens += counted  # an O_DIRECT open shares the id but its reads come here
        return backing.backing_id

    def attach(self, inode: int, node: Node, digest: str, fd: int) -> int | None:
        """Register the verified block file ``fd`` (now owned here) for ``inode``.

        Returns:
            The backing id for the open reply, or None: take the pyfuse3 path (``fd`` is
            closed). Call :meth:`opened_cached` then.
        """
        with self._locked():
            self._load(inode, node.snapshot_id)
            return self._attach(inode, node, digest, fd)

    def _attach(self, inode: int, node: Node, digest: str, fd: int) -> int | None:
        shared = self._share(inode, True)  # a concurrent open got there first: share its id
        if shared is not None or not self.enabled or self._cached.get(inode):
            os.close(fd)
            return shared
        assert self._open_backing is not None
        try:
            backing_id = self._open_backing(fd)
        except OSError as err:
            os.close(fd)
            if err.errno in _FATAL:
                self._disable(f"the kernel refused a backing file: {os.strerror(err.errno or 0)}")
            else:
                log.info("passthrough of %s refused (%s); pyfuse3 path", digest, err)
            return None
        self._backings[inode] = _Backing(
            backing_id, digest, node.snapshot_id, fd, checked=self._clock(), ident=_ident(fd)
        )
        self._record(inode)
        self.opens += 1
        return backing_id

    def opened_cached(self, inode: int) -> int | None:
        """A handle of ``inode`` is opened on the pyfuse3 path — unless the inode has a
        backing id with open handles by now (another open attached one while this one was
        deciding: mixing would fail the open), whose id is then returned to share."""
        with self._locked():
            self._load(inode)
            backing = self._backings.get(inode)
            if backing is not None and backing.handles > 0:
                return self._share(inode, False)  # an O_DIRECT-like join: not counted
            self._cached[inode] = self._cached.get(inode, 0) + 1
            self._record(inode)
            return None

    def released(self, inode: int, passthrough: bool) -> None:
        """A handle of ``inode`` was released; the last passthrough one makes the id idle
        (closed when idle ids are off or passthrough is)."""
        with self._locked():
            self._load(inode)
            self._release(inode, passthrough)
        self._trim()

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

    def _release(self, inode: int, passthrough: bool) -> None:
        if not passthrough:
            left = self._cached.get(inode, 0) - 1
            if left > 0:
                self._cached[inode] = left
            else:
                self._cached.pop(inode, None)
            self._record(inode)
            return
        backing = self._backings.get(inode)
        if backing is None:
            return
        backing.handles = max(0, backing.handles - 1)
        self._record(inode)
        if backing.handles > 0:
            return
        if not self.enabled or self.idle_max <= 0:
            self._close(inode)
            return
        self._idle.pop(inode, None)
        self._idle[inode] = None  # newest last
        if backing.fd >= 0:
            self._idle_fds.pop(inode, None)
            self._idle_fds[inode] = None

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
            mine = self._backings[inode] = _Backing(
                slot.backing_id, slot.digest, snapshot_id, fd, handles=slot.handles,
                checked=self._clock() if fd >= 0 else 0.0,  # gone: re-checked at once
                ident=_ident(fd),
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

    def _linked(self, backing: _Backing) -> bool:
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

    def _reopen(self, backing: _Backing) -> bool:
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

    def revoke(self, revoked: Iterable[str]) -> int:
        """End passthrough reads of revoked snapshots whose block file was evicted.

        The kernel holds its own reference to each backing file, so closing ids does not
        stop an open file. A block file still in the cache is truncated by the daemon's
        purge of the revoked version (when no live snapshot shares it); one already
        evicted (unlinked) is out of its reach but still read by open passthrough files,
        so it is truncated here, through our descriptor, unless a live snapshot's
        passthrough file here reads the same block. Returns how many were truncated.
        """
        gone = set(revoked)
        for inode in [i for i in self._idle if self._backings[i].snapshot_id in gone]:
            self._close_idle(inode)  # never opened again: its snapshot's opens fail
        if not self.exclusive:  # other workers' files may read the same block: never empty it
            return 0
        # an idle id of a live snapshot may be opened again: its block is kept whole too
        live = {b.digest for b in self._backings.values() if b.snapshot_id not in gone}
        done = 0
        for backing in self._backings.values():
            if backing.snapshot_id not in gone or backing.digest in live or backing.fd < 0:
                continue
            try:
                if os.fstat(backing.fd).st_nlink:
                    continue  # still in the cache: the daemon's purge truncates it
                rw = os.open(f"/proc/self/fd/{backing.fd}", os.O_WRONLY)
                try:
                    if os.fstat(rw).st_size:
                        os.ftruncate(rw, 0)
                        done += 1
                finally:
                    os.close(rw)
            except OSError as err:
                log.warning("revoked block %s not truncated: %s", backing.digest, err)
        self.truncated += done
        return done


def _ident(fd: int) -> tuple[int, int]:
    """The device and inode number of the file ``fd`` ((0, 0): none, or unknown)."""
    if fd < 0:
        return (0, 0)
    try:
        found = os.fstat(fd)
    except OSError:
        return (0, 0)
    return (found.st_dev, found.st_ino)
