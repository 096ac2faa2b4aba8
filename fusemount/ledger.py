"""The backing ledger: which passthrough backing ids and open handles this FUSE
connection's inodes have, kept where every process serving the connection reads them.

Backing ids (``FUSE_DEV_IOC_BACKING_OPEN``) belong to the FUSE connection, not to the
process that registered them, and the kernel's rules bind every open of an inode to its
one backing id or to none (:mod:`fusemount.passthrough`). A process that resumes the
connection after its predecessor died or handed it over (:mod:`spoke.disk.handover`), and
each of several mount workers serving it at once (``--mount-workers``), must therefore
know, per inode, the backing id the kernel may still use, how many passthrough handles
share it and how many handles are open on the pyfuse3 path — else an open of such an inode
fails (``EBUSY``/``ETXTBSY``: EIO for the reader) and ids leak, each keeping an evicted
block's disk space.

The ledger is a file mapped into memory (``CACHE_DIR/private/fuse-backings``), indexed
directly by inode number: slot ``i`` (32 bytes: backing id, passthrough handles, pyfuse3
handles, the block digest) is at ``i * 32``, so every process finds an inode's slot without
a shared index. Inode numbers are dense (:mod:`fusemount.tree`): a million files take
32 MiB. It is written in place (a store into the mapping, no system call) and survives a
SIGKILL in the page cache. The file's blocks are allocated before they are mapped
(``posix_fallocate``, :data:`CHUNK_SLOTS` at a time), so a full cache disk is an error here
(ENOSPC), never a SIGBUS. Processes change slots only under the file's exclusive
``flock`` (:meth:`BackingLedger.locked`: read, decide, write). An update is written before
the reply that makes it true reaches the kernel, so a successor may count a handle the
kernel never got (a request replayed by ``FUSE_NOTIFY_RESEND``: that id then stays
registered until unmount), never miss one.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from fusemount.flock import ReentrantFlock

_SLOT = struct.Struct("<iii4x16s")  # backing id, passthrough handles, pyfuse3 handles, digest
CHUNK_SLOTS = 32768  # 1 MiB of slots allocated at a time


@dataclass(frozen=True)
class LedgerRecord:
    """One inode's passthrough state in the ledger."""

    inode: int
    backing_id: int  # 0: none
    handles: int  # passthrough handles sharing the backing id
    cached: int  # handles open on the pyfuse3 path
    digest: str  # the backing file's block ("" without a backing id)


def _pack_digest(digest: str) -> bytes:
    try:
        return bytes.fromhex(digest)[:16]
    except ValueError:
        return b""


class BackingLedger:
    """The mapped ledger file of one FUSE connection.

    Args:
        path: the ledger file (owner-only: the cache's private directory).
        fresh: start empty (a new FUSE connection); else keep what the processes serving
            the connection wrote (read it with :meth:`records`).

    Raises:
        OSError: the file cannot be opened, sized or mapped.
    """

    def __init__(self, path: Path, fresh: bool) -> None:
        self.path = path
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | (os.O_TRUNC if fresh else 0)
        self._fd = os.open(path, flags, 0o600)
        self.failed = False  # a slot could not be written: a successor must not trust it
        self._lock = ReentrantFlock(self._fd)
        self.shared = False  # other workers read it: a slot not written must fail the open
        self._map: mmap.mmap | None = None
        self._count = 0
        try:
            self._map_to(max(os.fstat(self._fd).st_size // _SLOT.size, CHUNK_SLOTS))
        except OSError:
            os.close(self._fd)
            raise

    def _map_to(self, count: int) -> None:
        """Allocate (if need be) and map the first ``count`` slots (rounded up to chunks)."""
        count = -(-count // CHUNK_SLOTS) * CHUNK_SLOTS
        if count <= self._count:
            return
        os.posix_fallocate(self._fd, 0, count * _SLOT.size)  # never shrinks the file
        # a new mapping, not mmap.resize: that would ftruncate a file another process grew
        old, self._map = self._map, mmap.mmap(self._fd, count * _SLOT.size)
        if old is not None:
            old.close()
        self._count = count

    def locked(self) -> contextlib.AbstractContextManager[None]:
        """Hold the ledger's exclusive lock (``flock``; re-entrant in this process) for a
        read-decide-write of slots that other processes of the connection also change."""
        return self._lock.held()

    def get(self, inode: int) -> LedgerRecord:
        """``inode``'s slot as it stands (all zero when never written)."""
        if inode >= self._count:
            size = os.fstat(self._fd).st_size // _SLOT.size  # another process grew it
            if inode >= size:
                return LedgerRecord(inode, 0, 0, 0, "")
            self._map_to(size)
        assert self._map is not None
        backing, handles, cached, digest = _SLOT.unpack_from(self._map, inode * _SLOT.size)
        text = digest.hex() if backing else ""
        return LedgerRecord(inode, backing, handles, cached, text)

    def records(self) -> list[LedgerRecord]:
        """Every inode with a backing id or an open handle."""
        self.get(self._count)  # map what other processes added
        assert self._map is not None
        out = []
        for inode, (backing, handles, cached, digest) in enumerate(_SLOT.iter_unpack(self._map)):
            if backing or handles or cached:
                out.append(LedgerRecord(inode, backing, handles, cached, digest.hex()))
        return out

    def put(self, inode: int, backing_id: int, handles: int, cached: int, digest: str) -> None:
        """Write ``inode``'s slot (growing the file when it is past the end)."""
        if inode >= self._count:
            try:
                self._map_to(max(inode + 1, os.fstat(self._fd).st_size // _SLOT.size))
            except OSError:  # the cache disk is full: this connection is not resumable
                self.failed = True
                if self.shared:  # another worker would decide on a slot that is wrong
                    raise
                return
        assert self._map is not None
        packed = _pack_digest(digest) if backing_id else b""
        _SLOT.pack_into(self._map, inode * _SLOT.size, backing_id, handles, cached, packed)

    def drop(self, inode: int) -> None:
        """Clear ``inode``'s slot (it has no backing id and no open handle now)."""
        if inode < self._count:
            self.put(inode, 0, 0, 0, "")

    def close(self) -> None:
        """Unmap and close (the file keeps what was written)."""
        if self._map is not None:
            self._map.close()
        os.close(self._fd)
