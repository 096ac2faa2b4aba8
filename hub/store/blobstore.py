"""Content-addressed storage of block bytes.

:class:`BlobStore` is the interface the rest of the hub uses, with two implementations:
:class:`LocalBlobStore` keeps each block as one file, ``ROOT/<first 2 hex>/<digest>``;
:class:`~hub.store.s3blobs.S3BlobStore` keeps each block as one object, ``s3://BUCKET/PREFIX/<first
2
hex>/<digest>``, in any S3-compatible object store, through fsspec/s3fs (``put`` = PUT,
``read`` = ranged GET, ``delete`` = DeleteObjects; S3 is strongly read-after-write
consistent, https://aws.amazon.com/s3/consistency/). :func:`open_blob_store` picks one
from a location (a path or an ``s3://`` URL).

Invariants of the local store: a blob file is complete and matches its name from the
moment it appears (written to a temporary file in the same directory, fsynced, then
renamed over); blobs are never modified; ``put`` of a blob that exists is a no-op, so
concurrent publishers of the same block are harmless. Temporary files start with
``.tmp-`` and are never mistaken for blobs.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol

from hub.errors import BlockNotFound, ConfigError, CorruptBlob, StorageError, UnsafeDirectory
from hub.modes import DIR_MODE
from hub.snapshot.blocks import block_digest
from hub.snapshot.names import DIGEST_PATTERN, note_name, validate_digest
from hub.store.s3blobs import S3_SCHEME, S3BlobStore  # s3fs itself only when one is opened
from strata_local.atomic import write_atomic
from strata_local.ownership import UnsafePath, private_dir

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

    @property
    def location(self) -> str:
        """Where the store is: an absolute path or an ``s3://`` URL."""
        ...

    def iter_digests(self) -> Iterator[str]:
        """Yields the digest of every stored blob, in no particular order.

        Raises:
            StorageError: The store cannot be listed.
        """
        ...

    def delete(self, digests: Sequence[str]) -> None:
        """Deletes blobs; digests that are not stored are ignored.

        Raises:
            InvalidDigest: A digest is malformed.
            StorageError: The store refused or failed.
        """
        ...

    def clean_temp(self, older_than_s: float) -> int:
        """Removes leftovers of interrupted writes older than ``older_than_s`` seconds.

        Returns:
            The number of leftovers removed.
        """
        ...

    def read_note(self, name: str) -> bytes | None:
        """A small object kept beside the blobs (``gc``'s candidates), or None if absent.

        Raises:
            StorageError: The store cannot be read.
        """
        ...

    def write_note(self, name: str, data: bytes) -> None:
        """Replaces the note ``name`` whole (a reader sees the old one or the new one).

        Raises:
            StorageError: The store refused or failed.
        """
        ...


class LocalBlobStore:
    """A :class:`BlobStore` in a local directory: ``ROOT/<first 2 hex>/<digest>``.

    Owner-only: the root and its fan-out directories are 0700 (made so, and tightened
    here when found looser), blob files 0600 (``mkstemp``). A root another local user
    could change, or a fan-out directory or file at the top that is theirs or a symlink,
    is refused (:func:`strata_local.ownership.private_dir`).

    Args:
        root: The store's directory (``DATA_DIR/blobs``); created when missing.

    Raises:
        UnsafeDirectory: another local user could change the store.
        OSError: ``root`` cannot be created or tightened.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
        try:
            private_dir(self.root)
        except UnsafePath as err:
            raise UnsafeDirectory(f"blob store {self.root}: {err}") from None
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
            shard.mkdir(exist_ok=True, mode=DIR_MODE)
            with self._lock:
                self._unsynced_dirs.add(self.root)
        write_atomic(target, data, prefix=TEMP_PREFIX)
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
        try:  # plain os calls: a file object cost more than reading a 64 KiB block
            fd = os.open(self.path(digest), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise BlockNotFound(f"unknown block {digest}") from None
        try:
            if length is None:
                length = max(os.fstat(fd).st_size - offset, 0)
            parts = []
            while length > 0:
                part = os.pread(fd, length, offset)
                if not part:
                    break  # the end of the file
                parts.append(part)
                offset += len(part)
                length -= len(part)
        finally:
            os.close(fd)
        return parts[0] if len(parts) == 1 else b"".join(parts)

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

    @property
    def location(self) -> str:
        """See :attr:`BlobStore.location`: the store's absolute path."""
        return str(self.root.resolve())

    def _shards(self) -> Iterator[os.DirEntry[str]]:
        with os.scandir(self.root) as shards:
            for shard in shards:
                if len(shard.name) == 2 and shard.is_dir(follow_symlinks=False):
                    yield shard

    def iter_digests(self) -> Iterator[str]:
        """See :meth:`BlobStore.iter_digests`."""
        try:
            for shard in self._shards():
                with os.scandir(shard.path) as members:
                    for member in members:
                        if DIGEST_PATTERN.fullmatch(member.name):
                            yield member.name
        except OSError as exc:
            raise StorageError(f"cannot list blob store {self.root}: {exc.strerror}") from exc

    def delete(self, digests: Sequence[str]) -> None:
        """See :meth:`BlobStore.delete`."""
        for digest in digests:
            try:
                self.path(digest).unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise StorageError(f"cannot delete block {digest}: {exc.strerror}") from exc

    def read_note(self, name: str) -> bytes | None:
        """See :meth:`BlobStore.read_note`: ``ROOT/NAME`` (never a blob: blobs are in
        two-character shards)."""
        try:
            return (self.root / note_name(name)).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageError(f"cannot read {name} in {self.root}: {exc.strerror}") from exc

    def write_note(self, name: str, data: bytes) -> None:
        """See :meth:`BlobStore.write_note` (written whole, then renamed into place)."""
        try:
            write_atomic(self.root / note_name(name), data)
        except OSError as exc:
            raise StorageError(f"cannot write {name} in {self.root}: {exc.strerror}") from exc

    def clean_temp(self, older_than_s: float) -> int:
        """See :meth:`BlobStore.clean_temp`: removes ``.tmp-*`` files of crashed writers."""
        cutoff = time.time() - older_than_s
        removed = 0
        for shard in self._shards():
            with os.scandir(shard.path) as members:
                for member in members:
                    if member.name.startswith(TEMP_PREFIX):
                        with contextlib.suppress(FileNotFoundError):
                            if member.stat(follow_symlinks=False).st_mtime < cutoff:
                                os.unlink(member.path)
                                removed += 1
        return removed


def open_blob_store(
    location: str | os.PathLike[str], *, endpoint_url: str | None = None
) -> BlobStore:
    """Opens the blob store at ``location``.

    Args:
        location: ``s3://BUCKET[/PREFIX]`` for object storage, else a local directory
            (created when missing).
        endpoint_url: The S3 endpoint, for ``s3://`` locations only; None uses AWS's.

    Returns:
        The store.

    Raises:
        ConfigError: The location is malformed.
        StorageError: The local directory cannot be created.
        UnsafeDirectory: Another local user could change the local directory.
    """
    text = os.fspath(location)
    if text.startswith(S3_SCHEME):
        return S3BlobStore(text, endpoint_url=endpoint_url)
    if "://" in text:
        raise ConfigError(f"unsupported blob store {text!r}: use a path or s3://BUCKET/PREFIX")
    try:
        return LocalBlobStore(text)
    except OSError as exc:
        raise StorageError(f"cannot open blob store {text}: {exc.strerror or exc}") from exc
