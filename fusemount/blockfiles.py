"""Verified reads of cached block files, with a small table of open files.

Every block file is checked against its digest (xxh3-128) the first time this process
reads it, and again whenever its identity (inode, mtime, size) changes, so a block that
was damaged on disk is never served. Open files are kept in an LRU table so a hit costs
one ``pread``; :meth:`BlockFiles.read_cached` is that hit without blocking (``preadv2``
with ``RWF_NOWAIT``: only bytes already in the page cache), so the mount answers it on
its event loop without a thread hop, checking an open file's identity (one ``fstat``) at
most every ``recheck_after`` seconds (:data:`RECHECK_AFTER`) instead of on every read.
Entries are never closed explicitly: a dropped entry's file closes when the last thread
using it lets go (CPython reference counting), so a descriptor number is never reused
under a concurrent reader.

An evicted block is a miss, as in the daemon's accounting: an open entry whose file has
been unlinked (``st_nlink == 0``, seen by that ``fstat``) is dropped and the block looked
up again by path (on the loop's fast path within ``recheck_after`` of the eviction).
:meth:`BlockFiles.sweep` closes such entries even when nobody reads them, so evicted
blocks do not keep their disk space (up to ``max_open`` blocks of it) past the cache's
size. A read that already holds the descriptor when the eviction happens still finishes
with the verified bytes of that digest.

Encryption at rest (``cipher``; ``encrypted`` is then True, and the bytes on disk are not
the block's): a read decrypts only the 32 KiB segments it covers, each authenticated
(AES-GCM, :class:`~spoke.disk.encryption.BlockCipher`), instead of the first-read digest
check; the fast path reads those segments with ``RWF_NOWAIT`` and decrypts them on the
loop. A segment that fails authentication is a :class:`CorruptBlockError`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from io import FileIO

from spoke.disk.encryption import SEGMENT_BYTES, BlockCipher, CorruptBlock, FileKey
from spoke.disk.layout import CacheLayout, block_digest

log = logging.getLogger(__name__)


class CorruptBlockError(OSError):
    """A cached block file's bytes do not match its digest."""

    def __init__(self, digest: str) -> None:
        super().__init__(f"cached block {digest} failed verification")
        self.digest = digest


Identity = tuple[int, int, int]  # st_ino, st_mtime_ns, st_size
RECHECK_AFTER = 0.1  # seconds between identity checks of an open entry on the fast path
MAX_VERIFIED = 131_072
"""Most block identities remembered as verified (about 270 B each in CPython: ~35 MiB;
128 GiB of cache at 1 MiB blocks). The least recently read identity is forgotten first;
a forgotten block is verified again (one whole read and hash) the next time it is opened."""


@dataclass
class _OpenBlock:
    file: FileIO  # kept referenced: the descriptor stays open while an entry is in use
    fd: int
    identity: Identity
    checked: float  # time.monotonic() of the last identity check
    key: FileKey | None = None  # the key of a sealed file (encryption at rest)


def _identity(fd: int) -> Identity:
    st = os.fstat(fd)
    return st.st_ino, st.st_mtime_ns, st.st_size


class BlockFiles:
    """Read byte ranges of cached blocks, verifying each block file once per identity.

    Sixteen methods over one table of open, verified block files: the plain and the sealed
    (encrypted) read paths, their verification and the table's upkeep, which share the
    same entries and limits.

    Args:
        layout: the spoke's cache directory.
        max_open: most block files kept open.
        max_verified: most verified identities remembered (:data:`MAX_VERIFIED`).
        recheck_after: seconds between identity checks of an open file on the fast path.
        cipher: the spoke's key when block files are encrypted at rest (None: plain).
    """

    def __init__(
        self,
        layout: CacheLayout,
        max_open: int = 1024,
        recheck_after: float = RECHECK_AFTER,
        cipher: BlockCipher | None = None,
        max_verified: int = MAX_VERIFIED,
    ) -> None:
        self.layout = layout
        self.max_open = max_open
        self.recheck_after = recheck_after
        self._open: OrderedDict[str, _OpenBlock] = OrderedDict()
        self.max_verified = max_verified
        self._verified: OrderedDict[str, Identity] = OrderedDict()  # least recent first
        self._lock = threading.Lock()
        self.verifications = 0
        self.nowait = hasattr(os, "RWF_NOWAIT")  # cleared if the cache disk refuses it
        self.cipher = cipher
        self.encrypted = cipher is not None
        """Block files are sealed: their bytes are not the block's (no passthrough then)."""

    def read_cached(self, digest: str, offset: int, size: int) -> bytearray | None:
        """``size`` bytes at ``offset`` of an open, verified block file, without blocking.

        Safe on the event loop: it never opens or verifies a file and reads only bytes
        already in the kernel's page cache (``preadv2(RWF_NOWAIT)``, Linux ≥ 4.14; buffered
        reads since 5.9). The entry's identity is checked again (one ``fstat``: evicted?
        changed?) when its last check is ``recheck_after`` old, not on every read. Fewer
        bytes than asked at the file's end is the end of the block.

        Returns:
            The bytes, or None when the block is not open here, was evicted or changed,
            or is not all in the page cache (then :meth:`read` in a worker thread).
        """
        entry = self._open.get(digest)  # one dict read: atomic, so no lock on this path
        if entry is None or not self.nowait:
            return None
        now = time.monotonic()
        if now - entry.checked >= self.recheck_after:
            if not self._still_valid(entry):
                return None  # evicted or changed: read() drops the entry and looks again
            entry.checked = now
            with self._lock:
                if self._open.get(digest) is entry:
                    self._open.move_to_end(digest)
        if self.encrypted:
            return self._sealed_nowait(digest, entry, offset, size)
        want = max(min(size, entry.identity[2] - offset), 0)
        buf = bytearray(want)
        try:
            got = os.preadv(entry.fd, (buf,), offset, os.RWF_NOWAIT)
        except BlockingIOError:  # not in the page cache
            return None
        except OSError as err:  # e.g. EOPNOTSUPP: this filesystem cannot; always use threads
            log.info("preadv2(RWF_NOWAIT) on the cache disk failed (%s); reads use threads", err)
            self.nowait = False
            return None
        if got < want:  # partly in the page cache
            return None
        return buf

    @staticmethod
    def _still_valid(entry: _OpenBlock) -> bool:
        try:
            st = os.fstat(entry.fd)
        except OSError:
            return False
        return bool(st.st_nlink) and (st.st_ino, st.st_mtime_ns, st.st_size) == entry.identity

    def read(self, digest: str, offset: int, size: int) -> bytes | None:
        """``size`` bytes at ``offset`` of block ``digest``, or None when it is not cached.

        May block on the disk: call it from a worker thread. A block file that is missing,
        unlinked (evicted) or cannot be opened or read (``EACCES``, ``EIO``: e.g. deleted or
        damaged on the cache disk) is not cached — a miss, which the daemon repairs.

        Raises:
            CorruptBlockError: the file's bytes do not match the digest.
        """
        with self._lock:
            entry = self._open.get(digest)
            if entry is not None:
                self._open.move_to_end(digest)
        if entry is not None:
            if self._still_valid(entry):
                entry.checked = time.monotonic()
                try:
                    if self.encrypted:
                        return self._read_sealed(digest, entry, offset, size)
                    return os.pread(entry.fd, size, offset)
                except CorruptBlockError:
                    raise
                except OSError as err:
                    log.warning("cached block %s unreadable: %s", digest, err)
            self._drop(digest, entry)  # evicted, or changed under us: look it up again
        try:
            file = FileIO(self.layout.block_path(digest), "r")
        except FileNotFoundError:
            return None
        except OSError as err:
            log.warning("cached block %s cannot be opened: %s", digest, err)
            return None
        try:
            return self._verify_and_keep(digest, file, offset, size)
        except CorruptBlockError:
            raise
        except OSError as err:
            file.close()
            log.warning("cached block %s cannot be read: %s", digest, err)
            return None

    def _verify_and_keep(self, digest: str, file: FileIO, offset: int, size: int) -> bytes:
        identity = _identity(file.fileno())
        if self.encrypted:
            return self._keep_sealed(digest, file, identity, offset, size)
        with self._lock:
            known = self._verified.get(digest) == identity
            if known:
                self._verified.move_to_end(digest)
        if not known:
            data = file.readall()
            self.verifications += 1
            if block_digest(data) != digest:
                file.close()
                raise CorruptBlockError(digest)
        with self._lock:
            self._verified[digest] = identity
            self._verified.move_to_end(digest)
            while len(self._verified) > self.max_verified:
                self._verified.popitem(last=False)
            self._open[digest] = _OpenBlock(file, file.fileno(), identity, time.monotonic())
            while len(self._open) > self.max_open:
                self._open.popitem(last=False)
        return data[offset : offset + size] if not known else os.pread(file.fileno(), size, offset)

    def verified_fd(self, digest: str) -> int | None:
        """A new descriptor (``dup``; the caller closes it) of the block's file, verified
        against its digest like every read, or None when it is not cached or fails
        verification (the read path then fetches or repairs it as usual).

        May block on the disk (open and verify): call it from a worker thread. Used to
        hand a cached block file to the kernel for FUSE passthrough.
        """
        try:
            if self.read(digest, 0, 0) is None:
                return None
        except CorruptBlockError as err:
            log.error("%s; not handed to the kernel", err)
            self.forget(digest)
            return None
        with self._lock:  # dup under the lock: a concurrent drop cannot close it first
            entry = self._open.get(digest)
            return os.dup(entry.fd) if entry is not None else None

    def verified_fd_cached(self, digest: str) -> int | None:
        """:meth:`verified_fd` without blocking, for the event loop: a ``dup`` of an open,
        verified entry whose file is unchanged (one ``fstat``, as :meth:`read_cached`
        does), or None (then :meth:`verified_fd` in a worker thread)."""
        entry = self._open.get(digest)
        if entry is None or not self._still_valid(entry):
            return None
        with self._lock:  # dup under the lock: a concurrent drop cannot close it first
            return os.dup(entry.fd) if self._open.get(digest) is entry else None

    # -- encryption at rest (spoke/disk/encryption.py) -------------------------------------------

    def _keep_sealed(
        self, digest: str, file: FileIO, identity: Identity, offset: int, size: int
    ) -> bytes:
        """Open a sealed block file's entry (its header read) and read a range of it."""
        assert self.cipher is not None
        try:
            key = self.cipher.file_key(digest, os.pread(file.fileno(), 64, 0))
        except CorruptBlock:
            file.close()
            raise CorruptBlockError(digest) from None
        if self.cipher.plain_size(identity[2]) < 0:
            file.close()
            raise CorruptBlockError(digest)
        entry = _OpenBlock(file, file.fileno(), identity, time.monotonic(), key)
        data = self._read_sealed(digest, entry, offset, size)
        with self._lock:
            self._open[digest] = entry
            while len(self._open) > self.max_open:
                self._open.popitem(last=False)
        return data

    def _sealed_span(self, entry: _OpenBlock, offset: int, size: int) -> tuple[int, ...] | None:
        """(file offset, bytes, first segment, block size, bytes wanted) of a range of a
        sealed file; None when the range is empty."""
        assert self.cipher is not None
        plain = self.cipher.plain_size(entry.identity[2])
        want = min(size, plain - offset)
        if want <= 0:
            return None
        return (*self.cipher.span(plain, offset, want), plain, want)

    def _open_range(
        self, digest: str, entry: _OpenBlock, raw: bytes | bytearray, span: tuple[int, ...]
    ) -> bytearray:
        """The wanted bytes of the segments ``raw`` read at ``span``.

        Raises:
            CorruptBlock: a segment fails authentication (or is cut short).
        """
        assert entry.key is not None
        _, _, first, plain, _ = span
        data = entry.key.open_span(raw, first, plain)
        self.verifications += 1
        return data

    def _read_sealed(self, digest: str, entry: _OpenBlock, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset`` of a sealed block file, decrypted (blocking read).

        Raises:
            CorruptBlockError: a segment fails authentication, or the file is cut short.
        """
        span = self._sealed_span(entry, offset, size)
        if span is None:
            return b""
        raw = os.pread(entry.fd, span[1], span[0])
        try:
            data = self._open_range(digest, entry, raw, span)
        except CorruptBlock:
            self.forget(digest)
            raise CorruptBlockError(digest) from None
        skip = offset - span[2] * SEGMENT_BYTES
        return bytes(memoryview(data)[skip : skip + span[4]])

    def _sealed_nowait(
        self, digest: str, entry: _OpenBlock, offset: int, size: int
    ) -> bytearray | None:
        """:meth:`read_cached` of a sealed file: its segments if all in the page cache,
        decrypted on the caller's thread (None: not cached, or it fails: :meth:`read`
        then reads it again and raises)."""
        span = self._sealed_span(entry, offset, size)
        if span is None:
            return bytearray()
        buf = bytearray(span[1])
        try:
            got = os.preadv(entry.fd, (buf,), span[0], os.RWF_NOWAIT)
        except BlockingIOError:  # not in the page cache
            return None
        except OSError as err:
            log.info("preadv2(RWF_NOWAIT) on the cache disk failed (%s); reads use threads", err)
            self.nowait = False
            return None
        if got < span[1]:
            return None
        try:
            data = self._open_range(digest, entry, buf, span)
        except CorruptBlock:
            return None
        skip = offset - span[2] * SEGMENT_BYTES
        if skip == 0 and span[4] == len(data):  # an aligned read: no copy
            return data
        return bytearray(memoryview(data)[skip : skip + span[4]])

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

    def sweep(self) -> int:
        """Drop open entries whose block file was unlinked (evicted); returns how many.

        One ``fstat`` per open entry; run it now and then from a worker thread.
        """
        with self._lock:
            entries = list(self._open.items())
        dropped = 0
        for digest, entry in entries:
            try:
                gone = os.fstat(entry.file.fileno()).st_nlink == 0
            except (OSError, ValueError):  # closed under us by a concurrent drop
                continue
            if gone:
                self._drop(digest, entry)
                dropped += 1
        return dropped

    def _drop(self, digest: str, entry: _OpenBlock) -> None:
        """Forget ``digest`` if ``entry`` is still its open entry."""
        with self._lock:
            if self._open.get(digest) is entry:
                del self._open[digest]
                self._verified.pop(digest, None)

    def forget(self, digest: str) -> None:
        """Drop what is known about ``digest`` (it will be reopened and verified)."""
        with self._lock:
            self._open.pop(digest, None)
            self._verified.pop(digest, None)
