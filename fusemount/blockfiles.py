"""Verified reads of cached block files, with a small table of open files.

Every block file is checked against its digest (xxh3-128) the first time this process
reads it, and again whenever its identity (inode, mtime, size) changes, so a block that
was damaged on disk is never served. Open files are kept in an LRU table so a hit costs one
``fstat`` and one ``pread``. Entries are never closed explicitly: a dropped entry's file
closes when the last thread using it lets go (CPython reference counting), so a descriptor
number is never reused under a concurrent reader. An evicted block stays readable through a
file opened before the eviction (its bytes are still the verified bytes of that digest).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from io import FileIO

from spoke.layout import CacheLayout, block_digest


class CorruptBlockError(OSError):
    """A cached block file's bytes do not match its digest."""

    def __init__(self, digest: str) -> None:
        super().__init__(f"cached block {digest} failed verification")
        self.digest = digest


Identity = tuple[int, int, int]  # st_ino, st_mtime_ns, st_size


@dataclass
class _OpenBlock:
    file: FileIO
    identity: Identity


def _identity(fd: int) -> Identity:
    st = os.fstat(fd)
    return st.st_ino, st.st_mtime_ns, st.st_size


class BlockFiles:
    """Read byte ranges of cached blocks, verifying each block file once per identity.

    Args:
        layout: the spoke's cache directory.
        max_open: most block files kept open.
    """

    def __init__(self, layout: CacheLayout, max_open: int = 1024) -> None:
        self.layout = layout
        self.max_open = max_open
        self._open: OrderedDict[str, _OpenBlock] = OrderedDict()
        self._verified: dict[str, Identity] = {}
        self._lock = threading.Lock()
        self.verifications = 0

    def read(self, digest: str, offset: int, size: int) -> bytes | None:
        """``size`` bytes at ``offset`` of block ``digest``, or None when it is not cached.

        Raises:
            CorruptBlockError: the file's bytes do not match the digest.
        """
        with self._lock:
            entry = self._open.get(digest)
            if entry is not None:
                self._open.move_to_end(digest)
        if entry is not None:
            if _identity(entry.file.fileno()) == entry.identity:
                return os.pread(entry.file.fileno(), size, offset)
            self.forget(digest)  # changed under us: verify again
        try:
            file = FileIO(self.layout.block_path(digest), "r")
        except FileNotFoundError:
            return None
        identity = _identity(file.fileno())
        with self._lock:
            known = self._verified.get(digest) == identity
        if not known:
            data = file.readall()
            self.verifications += 1
            if block_digest(data) != digest:
                file.close()
                raise CorruptBlockError(digest)
        with self._lock:
            self._verified[digest] = identity
            self._open[digest] = _OpenBlock(file, identity)
            while len(self._open) > self.max_open:
                self._open.popitem(last=False)
        return data[offset : offset + size] if not known else os.pread(file.fileno(), size, offset)

    def warm(self, digest: str) -> bool:
        """Ask the kernel to read a cached block file into the page cache in the background.

        Returns:
            False when the block is not cached (it needs a fetch instead).
        """
        try:
            if self.read(digest, 0, 0) is None:
                return False
        except CorruptBlockError:
            return False
        with self._lock:
            entry = self._open.get(digest)
        if entry is not None:
            os.posix_fadvise(entry.file.fileno(), 0, 0, os.POSIX_FADV_WILLNEED)
        return True

    def forget(self, digest: str) -> None:
        """Drop what is known about ``digest`` (it will be reopened and verified)."""
        with self._lock:
            self._open.pop(digest, None)
            self._verified.pop(digest, None)
