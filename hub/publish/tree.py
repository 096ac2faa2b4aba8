"""Publishing a directory tree as a new version of a dataset.

The tree is streamed, never held whole: memory is bounded by one directory listing per
level of the tree being walked plus one batch of blocks, whatever the number of files.

1. walk the source tree in path order (:func:`hub.publish.walk.walk`: through directory
   descriptors, symlinks recorded, never followed), one directory listing at a time;
   then resolve every symlink inside the staged tree (:mod:`hub.publish.symlinks`) and refuse
   one that leaves it;
2. cut every regular file into blocks; stage each manifest entry in the catalog
   (:class:`hub.catalog.PublishSession`, small transactions under a manifest number no
   snapshot points at yet);
3. per batch of blocks: protect the digests from garbage collection, then store the
   blocks that are not stored yet (in parallel);
4. make the stored blocks durable (:meth:`hub.store.blobstore.BlobStore.sync`);
5. commit: the version, tag, snapshot, block references and events in one catalog write
   transaction (:meth:`hub.catalog.PublishSession.commit`).

A failure in steps 1-4 removes what was staged (or leaves it to ``strata-hub gc`` when
the process dies) and at most some unreferenced blobs; step 5 is all or nothing.
"""

from __future__ import annotations

import dataclasses
import os
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hub.auth.signing import load_signer
from hub.catalog import PublishSession
from hub.errors import HubError, SourceError
from hub.publish.symlinks import escape
from hub.publish.walk import Member, leaves_tree, open_file, read_link, walk
from hub.snapshot.blocks import DEFAULT_BLOCK_SIZE, MiB, read_blocks, validate_block_size
from hub.snapshot.manifest import EntryType, ManifestEntry
from hub.snapshot.names import validate_dataset, validate_tag, version_number
from hub.store.blobstore import BlobStore
from hub.store.datadir import DataDir

BATCH_BYTES = 64 * MiB
"""Most block bytes a publish holds in memory before protecting and storing them."""

BATCH_BLOCKS = 1024
"""Most blocks a publish protects (one catalog transaction) and stores at a time."""

STORE_THREADS = 8
"""Blocks stored in parallel (file writes with fsync, or object PUTs)."""


@dataclasses.dataclass(frozen=True, slots=True)
class PublishResult:
    """What a publish did.

    Attributes:
        dataset: The dataset's name.
        version: The new version, e.g. ``"v3"``.
        snapshot_id: The new snapshot's id, 32 lowercase hex characters.
        files: Number of regular files in the snapshot.
        bytes: Sum of the regular files' sizes, bytes.
        new_blocks: Blocks that were not stored before this publish.
        new_bytes: Bytes of those new blocks.
        entries: Manifest entries (files, directories and symlinks).
        seconds: Wall time of the publish, seconds.
    """

    dataset: str
    version: str
    snapshot_id: str
    files: int
    bytes: int
    new_blocks: int
    new_bytes: int
    entries: int = 0
    seconds: float = 0.0


class _BlockWriter:
    """Buffers blocks, protects them in the catalog, then stores them in parallel."""

    def __init__(self, store: BlobStore, session: PublishSession, pool: ThreadPoolExecutor):
        self._store = store
        self._session = session
        self._pool = pool
        self._pending: dict[str, bytes] = {}
        self._pending_bytes = 0
        self.new_blocks = 0
        self.new_bytes = 0

    def add(self, digest: str, data: bytes) -> None:
        if digest not in self._pending:
            self._pending[digest] = data
            self._pending_bytes += len(data)
        if self._pending_bytes >= BATCH_BYTES or len(self._pending) >= BATCH_BLOCKS:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        batch, self._pending, self._pending_bytes = self._pending, {}, 0
        self._session.protect(batch)  # before storing: gc must not delete what we rely on
        items = list(batch.items())
        step = STORE_THREADS * 16  # bounds the futures in flight (each costs ~1 KiB)
        for start in range(0, len(items), step):
            group = items[start : start + step]
            for (_, data), stored in zip(group, self._pool.map(self._put, group), strict=True):
                if stored:
                    self.new_blocks += 1
                    self.new_bytes += len(data)

    def _put(self, item: tuple[str, bytes]) -> bool:
        digest, data = item
        try:
            return self._store.put(digest, data)
        except OSError as exc:
            raise HubError(f"cannot store block {digest}: {exc.strerror or exc}") from exc


READABLE_FILE = 0o444
"""Bits ``readable_by_all`` adds to a file's mode (and 0o111 to one any class may run)."""
READABLE_DIR = 0o555
"""Bits ``readable_by_all`` adds to a directory's mode."""


def readable(mode: int, directory: bool) -> int:
    """``mode`` (permission bits) opened to every uid: read for files (and execute for
    all where anyone may execute it), read and search for directories; nothing removed."""
    if directory:
        return mode | READABLE_DIR
    return mode | READABLE_FILE | (0o111 if mode & 0o111 else 0)


def _file_entry(member: Member, block_size: int, writer: _BlockWriter) -> ManifestEntry:
    """Reads a regular file's blocks (streaming, one block at a time) and describes it."""
    fd = open_file(member)
    with open(fd, "rb") as stream:
        before = os.fstat(fd)
        blocks = []
        size = 0
        reader = read_blocks(stream, block_size)
        while True:
            try:
                block = next(reader, None)
            except OSError as exc:
                raise SourceError(f"cannot read {member.path!r}: {exc.strerror or exc}") from exc
            if block is None:
                break
            writer.add(block.digest, block.data)
            blocks.append(block.ref)
            size += len(block.data)
        after = os.fstat(fd)
    if size != before.st_size or after.st_size != size or after.st_mtime_ns != before.st_mtime_ns:
        raise SourceError(f"cannot publish {member.path!r}: it changed while publishing")
    return ManifestEntry(
        path=member.path,
        type=EntryType.FILE,
        mode=stat.S_IMODE(before.st_mode),
        size=size,
        mtime_ns=before.st_mtime_ns,
        blocks=tuple(blocks),
    )


def _symlink_entry(member: Member, allow_external: bool) -> ManifestEntry:
    target = read_link(member)
    if not allow_external and leaves_tree(member.path, target):
        raise SourceError(
            f"cannot publish symlink {member.path!r}: its target {target!r} points outside "
            "the snapshot (use --allow-external-symlinks to publish it anyway)"
        )
    return ManifestEntry(
        path=member.path,
        type=EntryType.SYMLINK,
        mode=stat.S_IMODE(member.mode),
        size=len(target.encode("utf-8")),
        mtime_ns=member.mtime_ns,
        symlink_target=target,
    )


def _refuse_escaping_symlinks(session: PublishSession) -> None:
    """Resolve every staged symlink inside the staged tree as the kernel would
    (:func:`hub.publish.symlinks.escape`) and refuse the first that leaves it.

    Raises:
        SourceError: a symlink leaves the snapshot once other symlinks are followed.
    """

    def lookup(path: str) -> tuple[EntryType, str] | None:
        entry = session.staged(path)
        return None if entry is None else (entry.type, entry.symlink_target)

    for link in session.staged_symlinks():
        why = escape(link.path, link.symlink_target, lookup)
        if why is not None:
            raise SourceError(
                f"cannot publish symlink {link.path!r}: its target {link.symlink_target!r} "
                f"{why}, so it points outside the snapshot "
                "(use --allow-external-symlinks to publish it anyway)"
            )


def publish(
    data_dir: str | os.PathLike[str],
    dataset: str,
    src_dir: str | os.PathLike[str],
    tag: str | None = "latest",
    block_size: int = DEFAULT_BLOCK_SIZE,
    *,
    version: str | None = None,
    blobs: str | None = None,
    s3_endpoint: str | None = None,
    signing_key: str | os.PathLike[str] | None = None,
    allow_external_symlinks: bool = False,
    catalog: str | None = None,
    readable_by_all: bool = False,
) -> PublishResult:
    """Publishes a directory tree as the next version of a dataset.

    Regular files, directories (empty ones included) and symlinks (stored with their
    target, not followed) are recorded with their permission bits, size and mtime;
    any other file type is refused, and so is a symlink whose target leaves the tree
    (absolute, or ``..`` above the root: by its text, :func:`hub.publish.walk.leaves_tree`, and
    once the walk is done, resolved through the snapshot's other symlinks as the kernel
    would, :func:`hub.publish.symlinks.escape`) unless ``allow_external_symlinks``. The tree is
    walked through directory descriptors (:mod:`hub.publish.walk`), so a component swapped for a
    symlink while publishing is refused, never followed. The data directory is created
    when missing. Only blocks the store does not hold yet are written, so a new version
    that changes one file stores only that file's changed blocks.

    Args:
        data_dir: The hub's data directory.
        dataset: The dataset's name; created by its first publish.
        src_dir: The tree to publish; its contents become the snapshot's root.
        tag: A tag to point at the new version (default ``"latest"``), or None.
        block_size: Maximum block length, bytes (default 4 MiB).
        version: Publish as exactly this version (e.g. ``"v3"``, which must be the next
            one); refused with :class:`~hub.errors.VersionExists` when it exists.
        blobs: The blob store (a path or ``s3://BUCKET/PREFIX``); default the one the
            catalog records, else ``DATA_DIR/blobs``.
        s3_endpoint: The S3 endpoint URL, for ``s3://`` stores.
        signing_key: An Ed25519 private key (PEM, ``strata-hub keygen``): the new version
            is signed with it (:mod:`hub.auth.signing`). None: unsigned.
        allow_external_symlinks: Publish symlinks that point outside the tree too.
        catalog: A shared catalog's URL (``postgresql://…``, :mod:`hub.catalog.postgres`);
            None: the data directory's own.
        readable_by_all: Record every file readable by every uid (mode | 0o444, and
            | 0o111 where anyone may run it) and every directory readable and searchable
            (| 0o555), whatever the source's modes (:func:`readable`): for pods that run as
            any user. Default: the source's bits as they are.

    Returns:
        What was published; see :class:`PublishResult`.

    Raises:
        InvalidName: ``dataset``, ``tag`` or ``version`` is malformed.
        InvalidArgument: ``block_size`` is out of range or ``version`` is not next.
        VersionExists: ``version`` is already published.
        SourceError: ``src_dir`` is missing, not a directory, unreadable, holds an
            unsupported file type, a non-UTF-8 name or (without
            ``allow_external_symlinks``) a symlink leaving the tree, or changed (a member
            replaced, a file resized) while being read.
        DataDirNotFound: ``data_dir`` exists but is not a directory.
        Conflict: ``blobs`` is not the store the catalog records.
        StorageError: The blob store failed.
        CatalogError: The catalog cannot be opened or written.
        SigningKeyError: ``signing_key`` is unusable (checked before anything is read).
    """
    started = time.monotonic()
    signer = load_signer(Path(signing_key)) if signing_key is not None else None
    validate_dataset(dataset)
    if tag is not None:
        validate_tag(tag)
    if version is not None:
        version_number(version)
    validate_block_size(block_size)
    root = Path(src_dir)
    if not root.exists():
        raise SourceError(f"source dir {root} does not exist")
    if not root.is_dir():
        raise SourceError(f"source {root} is not a directory")

    layout = DataDir.open(data_dir, create=True, catalog=catalog)
    with (
        layout.open_catalog(create=True) as opened,
        ThreadPoolExecutor(STORE_THREADS, thread_name_prefix="strata-publish") as pool,
    ):
        store = layout.blob_store(opened, blobs, endpoint_url=s3_endpoint)
        session = opened.begin_publish(block_size)
        try:
            writer = _BlockWriter(store, session, pool)
            symlinks = 0
            for member in walk(root):
                kind = stat.S_IFMT(member.mode)
                if kind == stat.S_IFREG:
                    entry = _file_entry(member, block_size, writer)
                    if readable_by_all:
                        entry = dataclasses.replace(entry, mode=readable(entry.mode, False))
                    session.add(entry)
                elif kind == stat.S_IFLNK:
                    session.add(_symlink_entry(member, allow_external_symlinks))
                    symlinks += 1
                else:
                    session.add(
                        ManifestEntry(
                            path=member.path,
                            type=EntryType.DIRECTORY,
                            mode=readable(stat.S_IMODE(member.mode), True)
                            if readable_by_all
                            else stat.S_IMODE(member.mode),
                            size=0,
                            mtime_ns=member.mtime_ns,
                        )
                    )
            if symlinks and not allow_external_symlinks:
                _refuse_escaping_symlinks(session)
            writer.flush()
            try:
                store.sync()
            except OSError as exc:
                raise HubError(f"cannot sync blob store {store.location}: {exc.strerror}") from exc
            snapshot = session.commit(dataset, tag=tag, version=version, signer=signer)
        finally:
            session.abort()
    return PublishResult(
        dataset=dataset,
        version=snapshot.version,
        snapshot_id=snapshot.snapshot_id,
        files=snapshot.file_count,
        bytes=snapshot.total_bytes,
        new_blocks=writer.new_blocks,
        new_bytes=writer.new_bytes,
        entries=snapshot.entry_count,
        seconds=time.monotonic() - started,
    )
