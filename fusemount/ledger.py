"""The backing ledger: which passthrough backing ids and open handles this FUSE
connection's inodes have, kept where a successor process can read them.

Backing ids (``FUSE_DEV_IOC_BACKING_OPEN``) belong to the FUSE connection, not to the
process that registered them, and the kernel's rules bind every open of an inode to its
one backing id or to none (:mod:`fusemount.passthrough`). A process that resumes the
connection after its predecessor died or handed it over (:mod:`fusemount.handover`) must
therefore know, per inode, the backing id the kernel may still use, how many passthrough
handles share it and how many handles are open on the pyfuse3 path — else its next open of
such an inode fails (``EBUSY``/``ETXTBSY``: EIO for the reader) and the predecessor's ids
leak, each keeping an evicted block's disk space.

The ledger is a file mapped into memory (``CACHE_DIR/private/fuse-backings``), one
152-byte slot per inode with a backing id or open handles, written in place on every open
and release (a store into the mapping, no system call): it survives a SIGKILL in the page
cache. The file's blocks are allocated before they are mapped (``posix_fallocate``), so a
full cache disk is an error here (ENOSPC), never a SIGBUS. An update is written before the
reply that makes it true reaches the kernel, so a successor may count a handle the kernel
never got (a request replayed by ``FUSE_NOTIFY_RESEND``: that id then stays registered
until unmount), never miss one.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

_SLOT = struct.Struct("<QiiiI64s64s")  # inode, backing id, passthrough, cached, -, digest, snapshot
FIRST_SLOTS = 256  # 38 KiB; doubles when full


@dataclass(frozen=True)
class LedgerRecord:
    """One inode's passthrough state as a predecessor left it."""

    inode: int
    backing_id: int  # 0: none
    handles: int  # passthrough handles sharing the backing id
    cached: int  # handles open on the pyfuse3 path
    digest: str
    snapshot_id: str


class BackingLedger:
    """The mapped ledger file; every method runs on the mount's event loop.

    Args:
        path: the ledger file (owner-only: the cache's private directory).
        fresh: start empty (a new FUSE connection); else keep the predecessor's slots
            (read them with :meth:`records` first).

    Raises:
        OSError: the file cannot be opened, sized or mapped.
    """

    def __init__(self, path: Path, fresh: bool) -> None:
        self.path = path
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | (os.O_TRUNC if fresh else 0)
        self._fd = os.open(path, flags, 0o600)
        self.failed = False  # a slot could not be written: a successor must not trust it
        size = os.fstat(self._fd).st_size
        self._count = max(FIRST_SLOTS, size // _SLOT.size)
        try:
            os.posix_fallocate(self._fd, 0, self._count * _SLOT.size)
            self._map = mmap.mmap(self._fd, self._count * _SLOT.size)
        except OSError:
            os.close(self._fd)
            raise
        self._slots: dict[int, int] = {}  # inode -> slot
        self._free: list[int] = []
        for slot in reversed(range(self._count)):
            inode = struct.unpack_from("<Q", self._map, slot * _SLOT.size)[0]
            if inode:
                self._slots[inode] = slot
            else:
                self._free.append(slot)

    def records(self) -> list[LedgerRecord]:
        """Every inode's slot as it stands."""
        out = []
        for slot in self._slots.values():
            inode, backing, handles, cached, _, digest, snapshot = _SLOT.unpack_from(
                self._map, slot * _SLOT.size
            )
            text = digest.rstrip(b"\0").decode(), snapshot.rstrip(b"\0").decode()
            out.append(LedgerRecord(inode, backing, handles, cached, *text))
        return out

    def put(
        self, inode: int, backing_id: int, handles: int, cached: int, digest: str, snapshot: str
    ) -> None:
        """Write ``inode``'s slot (taking a free one, growing the file when none is)."""
        slot = self._slots.get(inode)
        if slot is None:
            if not self._free:
                try:
                    self._grow()
                except OSError:  # the cache disk is full: this connection is not resumable
                    self.failed = True
                    return
            slot = self._slots[inode] = self._free.pop()
        _SLOT.pack_into(
            self._map, slot * _SLOT.size, inode, backing_id, handles, cached, 0,
            digest.encode(), snapshot.encode(),
        )  # fmt: skip

    def drop(self, inode: int) -> None:
        """Free ``inode``'s slot (it has no backing id and no open handle now)."""
        slot = self._slots.pop(inode, None)
        if slot is not None:
            struct.pack_into("<Q", self._map, slot * _SLOT.size, 0)
            self._free.append(slot)

    def _grow(self) -> None:
        old = self._count
        os.posix_fallocate(self._fd, 0, old * 2 * _SLOT.size)
        self._map.resize(old * 2 * _SLOT.size)
        self._count = old * 2
        self._free.extend(reversed(range(old, self._count)))

    def close(self) -> None:
        """Unmap and close (the file keeps what was written)."""
        self._map.close()
        os.close(self._fd)
