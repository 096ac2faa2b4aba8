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

The registered ids themselves — idle ones kept for the next open, their checks, the
ledger shared with other workers — are :mod:`fusemount.backings`'s.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pyfuse3

from fusemount.backings import (
    ACTIVE_BACKINGS,
    IDLE_BACKINGS,
    IDLE_IDS,
    RECHECK_S,
    Backing,
    Backings,
    ident,
)
from fusemount.ledger import BackingLedger
from fusemount.tree import Node

log = logging.getLogger(__name__)

# errnos of BACKING_OPEN that say passthrough cannot work here at all (not this file)
_FATAL = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTTY, errno.EINVAL, errno.ENOSYS}


class Passthrough(Backings):
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
        active_max: inodes with passthrough handles open at once (:data:`ACTIVE_BACKINGS`);
            an open of another inode takes the pyfuse3 path.
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
        active_max: int = ACTIVE_BACKINGS,
    ) -> None:
        super().__init__(
            close_backing or getattr(pyfuse3, "passthrough_close", None),
            idle_max, idle_ids, clock, ledger, block_path, exclusive, snapshot_of,
        )  # fmt: skip
        self.reason = reason
        self.enabled = not reason
        self.opens = 0  # opens answered with a backing id since start
        self.reuses = 0  # of those, opens that took an idle id (no registration)
        self.truncated = 0  # block files truncated by revocations
        self.active_max = active_max
        self.over_active = 0  # opens sent to the pyfuse3 path by active_max
        self._open_backing = open_backing or getattr(pyfuse3, "passthrough_open", None)

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
        already has handles on the pyfuse3 path, or :attr:`active_max` inodes have
        passthrough handles open."""
        if not self.enabled or self._cached.get(inode):
            return None
        if len(self._backings) - len(self._idle) >= self.active_max:
            self.over_active += 1
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
        self._backings[inode] = Backing(
            backing_id, digest, node.snapshot_id, fd, checked=self._clock(), ident=ident(fd)
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
