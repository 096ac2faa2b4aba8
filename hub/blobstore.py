"""Content-addressed storage of block bytes.

:class:`BlobStore` is the interface the rest of the hub uses; :class:`LocalBlobStore`
keeps each block as one file, ``ROOT/<first 2 hex>/<digest>``. An S3-compatible store
can implement the same interface later (``put`` = conditional PUT, ``read`` = ranged GET).

Invariants of the local store: a blob file is complete and matches its name from the
moment it appears (written to a temporary file in the same directory, fsynced, then
renamed over); blobs are never modified; ``put`` of a blob that exists is a no-op, so
concurrent publishers of the same block are harmless. Temporary files start with
``.tmp-`` and are never mistaken for blobs.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from pathlib import Path
from typing import Protocol

from hub.blocks import block_digest
from hub.errors import BlockNotFound, CorruptBlob
from hub.names import validate_digest

TEMP_PREFIX = ".tmp-"


class BlobStore(Protocol):
    """Where block bytes live, keyed by their xxh3-128 hex digest."""

    def exists(self, digest: str) -> bool:
        """Tells whether the blob is stored.

        Raises:
            InvalidDigest: ``digest`` is malformed.
        """
        ...

    def put(self, digest: str, data: bytes) -> bool:
        """Stores a blob unless it is already there.

        Args:
            digest: xxh3-128 hex digest of ``data``.
            data: The block's bytes.

        Returns:
            True when the blob was newly stored, False when it already existed.

        Raises:
            InvalidDigest: ``digest`` is malformed.
            CorruptBlob: ``data`` does not hash to ``digest``.
        """
        ...

    def size(self, digest: str) -> int:
        """Length of a stored blob, bytes.

        Raises:
            InvalidDigest: ``digest`` is malformed.
            BlockNotFound: The blob is not stored.
        """
        ...

    def read(self, digest: str, offset: int = 0, length: int | None = None) -> bytes:
        """Reads a byte range of a stored blob.

        Args:
            digest: The blob's digest.
            offset: First byte to read.
            length: Number of bytes to read; None reads to the end.

        Returns:
            Exactly ``length`` bytes (fewer only when the range passes the blob's end).

        Raises:
            InvalidDigest: ``digest`` is malformed.
            BlockNotFound: The blob is not stored.
        """
        ...

    def sync(self) -> None:
        """Makes every blob stored so far durable (survives a crash) before returning."""
        ...


class LocalBlobStore:
    """A :class:`BlobStore` in a local directory: ``ROOT/<first 2 hex>/<digest>``.

    Args:
        root: The store's directory (``DATA_DIR/blobs``); created when missing.

    Raises:
        OSError: ``root`` cannot be created.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._unsynced_dirs: set[Path] = set()

    def path(self, digest: str) -> Path:
        """The file that holds a blob (whether or not it exists).

        Raises:
            InvalidDigest: ``digest`` is malformed.
        """
        validate_digest(digest)
        return self.root / digest[:2] / digest

    def exists(self, digest: str) -> bool:
        """See :meth:`BlobStore.exists`."""
        return self.path(digest).is_file()

    def put(self, digest: str, data: bytes) -> bool:
        """See :meth:`BlobStore.put`; writes a temp file, fsyncs it and renames it into place."""
        target = self.path(digest)
        if target.is_file():
            return False
        if block_digest(data) != digest:
            raise CorruptBlob(f"block bytes do not match digest {digest}")
        shard = target.parent
        if not shard.is_dir():
            shard.mkdir(exist_ok=True)
            with self._lock:
                self._unsynced_dirs.add(self.root)
        fd, temp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=shard)
        try:
            with os.fdopen(fd, "wb") as stream:
                stream.write(data)
                stream.flush()
                os.fsync(stream.fileno())
            os.replace(temp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
        with self._lock:
            self._unsynced_dirs.add(shard)
        return True

    def size(self, digest: str) -> int:
        """See :meth:`BlobStore.size`."""
        try:
            return self.path(digest).stat().st_size
        except FileNotFoundError:
            raise BlockNotFound(f"unknown block {digest}") from None

    def read(self, digest: str, offset: int = 0, length: int | None = None) -> bytes:
        """See :meth:`BlobStore.read`."""
        if offset < 0 or (length is not None and length < 0):
            raise ValueError(f"invalid range: offset {offset}, length {length}")
        try:
            with self.path(digest).open("rb") as stream:
                stream.seek(offset)
                return stream.read() if length is None else stream.read(length)
        except FileNotFoundError:
            raise BlockNotFound(f"unknown block {digest}") from None

    def sync(self) -> None:
        """See :meth:`BlobStore.sync`; fsyncs the directories that gained entries."""
        with self._lock:
            dirs, self._unsynced_dirs = self._unsynced_dirs, set()
        for directory in sorted(dirs):
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
