"""Publishing a directory tree as a new version of a dataset.

The tree is streamed, never held whole: memory is bounded by one directory listing per
level of the tree being walked plus one batch of blocks, whatever the number of files.

1. walk the source tree in path order (:func:`walk`; symlinks are recorded, never
   followed), one directory listing at a time;
2. cut every regular file into blocks; stage each manifest entry in the catalog
   (:class:`hub.catalog.PublishSession`, small transactions under a manifest number no
   snapshot points at yet);
3. per batch of blocks: protect the digests from garbage collection, then store the
   blocks that are not stored yet (in parallel);
4. make the stored blocks durable (:meth:`hub.blobstore.BlobStore.sync`);
5. commit: the version, tag, snapshot, block references and events in one catalog write
   transaction (:meth:`hub.catalog.PublishSession.commit`).

A failure in steps 1-4 removes what was staged (or leaves it to ``strata-hub gc`` when
the process dies) and at most some unreferenced blobs; step 5 is all or nothing.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from hub.blobstore import BlobStore
from hub.blocks import DEFAULT_BLOCK_SIZE, MiB, read_blocks, validate_block_size
from hub.catalog import Catalog, PublishSession
from hub.datadir import DataDir
from hub.errors import HubError, SourceError
from hub.manifest import EntryType, ManifestEntry
from hub.names import validate_dataset, validate_tag, version_number
from hub.signing import load_signer

BATCH_BYTES = 64 * MiB
"""Most block bytes a publish holds in memory before protecting and storing them."""

BATCH_BLOCKS = 1024
"""Most blocks a publish protects (one catalog transaction) and stores at a time."""

STORE_THREADS = 8
"""Blocks stored in parallel (file writes with fsync, or object PUTs)."""

_FILE_TYPE_NAMES = {
    stat.S_IFIFO: "named pipe",
    stat.S_IFSOCK: "socket",
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
}


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class Member:
    """A member of the source tree, as the walk found it (lstat, not followed).

    Attributes:
        path: Manifest path, relative to the source root.
        mode: ``st_mode`` (type and permission bits).
        ino: Inode number, to notice a member replaced while publishing.
        mtime_ns: Modification time, nanoseconds since the Unix epoch.
    """

    path: str
    mode: int
    ino: int
    mtime_ns: int


def _utf8_name(relative: str) -> str:
    try:
        relative.encode("utf-8")
    except UnicodeEncodeError:
        raise SourceError(f"cannot publish {relative!r}: the name is not valid UTF-8") from None
    return relative


def _listing(root: Path, prefix: str) -> list[tuple[bool, Member]]:
    """One directory's members as walk steps, in path order.

    Each member is a step ``(False, member)`` keyed by its name; a directory also gives a
    step ``(True, member)`` ("descend") keyed by its name plus ``/``. Sorting the keys by
    their UTF-8 bytes interleaves the descents exactly where the directory's contents fall
    in global path order: every path below ``d`` starts with ``d/`` and no sibling name
    starts with ``d/``, so ``d``'s contents sort after every sibling below ``d/`` and
    before every sibling above it (e.g. ``a``, ``a-b``, ``a/x``: ``-`` < ``/``).
    """
    directory = root / prefix if prefix else root
    keyed: list[tuple[bytes, bool, Member]] = []
    try:
        with os.scandir(directory) as members:
            for entry in members:
                relative = _utf8_name(prefix + entry.name)
                st = entry.stat(follow_symlinks=False)
                kind = stat.S_IFMT(st.st_mode)
                if kind not in (stat.S_IFDIR, stat.S_IFREG, stat.S_IFLNK):
                    name = _FILE_TYPE_NAMES.get(kind, f"file type {kind:#o}")
                    raise SourceError(f"cannot publish {relative!r}: it is a {name}")
                member = Member(relative, st.st_mode, st.st_ino, st.st_mtime_ns)
                key = entry.name.encode("utf-8")
                keyed.append((key, False, member))
                if kind == stat.S_IFDIR:
                    keyed.append((key + b"/", True, member))
    except OSError as exc:
        where = prefix.rstrip("/") or str(root)
        raise SourceError(f"cannot read {where!r}: {exc.strerror or exc}") from exc
    keyed.sort(key=lambda step: step[0])
    return [(descend, member) for _, descend, member in keyed]


def walk(root: Path) -> Iterator[Member]:
    """Yields every member below ``root`` in path order, one directory listing per level.

    Path order is ascending by the path's UTF-8 bytes (see :mod:`hub.manifest`). The walk
    keeps one sorted listing per directory level being visited, never the whole tree.

    Args:
        root: The source directory.

    Yields:
        The members, in path order; symlinks are not followed.

    Raises:
        SourceError: A directory cannot be read, a name is not UTF-8, or a member is of
            an unsupported type (FIFO, socket, device).
    """
    stack = [iter(_listing(root, ""))]
    while stack:
        step = next(stack[-1], None)
        if step is None:
            stack.pop()
            continue
        descend, member = step
        if descend:
            stack.append(iter(_listing(root, member.path + "/")))
        else:
            yield member


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


def _file_entry(root: Path, member: Member, block_size: int, writer: _BlockWriter) -> ManifestEntry:
    """Reads a regular file's blocks (streaming, one block at a time) and describes it."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(root / member.path, flags)
    except OSError as exc:
        raise SourceError(f"cannot read {member.path!r}: {exc.strerror or exc}") from exc
    with open(fd, "rb") as stream:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode) or before.st_ino != member.ino:
            raise SourceError(f"cannot publish {member.path!r}: it was replaced while publishing")
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


def _symlink_entry(root: Path, member: Member) -> ManifestEntry:
    try:
        target = os.readlink(root / member.path)
    except OSError as exc:
        raise SourceError(f"cannot read symlink {member.path!r}: {exc.strerror or exc}") from exc
    try:
        size = len(target.encode("utf-8"))
    except UnicodeEncodeError:
        raise SourceError(
            f"cannot publish symlink {member.path!r}: its target is not valid UTF-8"
        ) from None
    return ManifestEntry(
        path=member.path,
        type=EntryType.SYMLINK,
        mode=stat.S_IMODE(member.mode),
        size=size,
        mtime_ns=member.mtime_ns,
        symlink_target=target,
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
) -> PublishResult:
    """Publishes a directory tree as the next version of a dataset.

    Regular files, directories (empty ones included) and symlinks (stored with their
    target, not followed) are recorded with their permission bits, size and mtime;
    any other file type is refused. The data directory is created when missing. Only
    blocks the store does not hold yet are written, so a new version that changes one
    file stores only that file's changed blocks.

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
            is signed with it (:mod:`hub.signing`). None: unsigned.

    Returns:
        What was published; see :class:`PublishResult`.

    Raises:
        InvalidName: ``dataset``, ``tag`` or ``version`` is malformed.
        InvalidArgument: ``block_size`` is out of range or ``version`` is not next.
        VersionExists: ``version`` is already published.
        SourceError: ``src_dir`` is missing, not a directory, unreadable, holds an
            unsupported file type or a non-UTF-8 name, or changed while being read.
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

    layout = DataDir.open(data_dir, create=True)
    with (
        Catalog(layout.catalog_path) as catalog,
        ThreadPoolExecutor(STORE_THREADS, thread_name_prefix="strata-publish") as pool,
    ):
        store = layout.blob_store(catalog, blobs, endpoint_url=s3_endpoint)
        session = catalog.begin_publish(block_size)
        try:
            writer = _BlockWriter(store, session, pool)
            for member in walk(root):
                kind = stat.S_IFMT(member.mode)
                if kind == stat.S_IFREG:
                    session.add(_file_entry(root, member, block_size, writer))
                elif kind == stat.S_IFLNK:
                    session.add(_symlink_entry(root, member))
                else:
                    session.add(
                        ManifestEntry(
                            path=member.path,
                            type=EntryType.DIRECTORY,
                            mode=stat.S_IMODE(member.mode),
                            size=0,
                            mtime_ns=member.mtime_ns,
                        )
                    )
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
