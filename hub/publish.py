"""Publishing a directory tree as a new version of a dataset.

Order of work, so that a failure never leaves a half-written catalog:

1. walk the source tree (symlinks are recorded, never followed) and sort it by path;
2. cut every regular file into blocks and store the blocks that are not stored yet;
3. make the stored blocks durable (:meth:`hub.blobstore.BlobStore.sync`);
4. record the dataset, version, tag, snapshot and manifest in one catalog write
   transaction (:meth:`hub.catalog.Catalog.add_version`).

A failure in steps 1-3 leaves at most some unreferenced blobs (harmless; a later
garbage collection can remove them); step 4 is all or nothing.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from hub.blobstore import BlobStore, LocalBlobStore
from hub.blocks import DEFAULT_BLOCK_SIZE, Block, read_blocks, validate_block_size
from hub.catalog import Catalog
from hub.datadir import DataDir
from hub.errors import HubError, SourceError
from hub.manifest import EntryType, ManifestEntry
from hub.names import validate_dataset, validate_tag

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
    """

    dataset: str
    version: str
    snapshot_id: str
    files: int
    bytes: int
    new_blocks: int
    new_bytes: int


@dataclass(frozen=True, slots=True)
class _Found:
    """A source tree member: its manifest path, where it is, and its lstat."""

    path: str
    source: Path
    stat: os.stat_result


def _utf8_name(relative: str) -> str:
    try:
        relative.encode("utf-8")
    except UnicodeEncodeError:
        raise SourceError(f"cannot publish {relative!r}: the name is not valid UTF-8") from None
    return relative


def _scan(root: Path) -> list[_Found]:
    """Lists every member below ``root`` (not following symlinks), sorted by path."""
    found: list[_Found] = []
    pending: list[tuple[Path, str]] = [(root, "")]
    while pending:
        directory, prefix = pending.pop()
        try:
            with os.scandir(directory) as members:
                for member in members:
                    relative = _utf8_name(prefix + member.name)
                    source = Path(member.path)
                    st = member.stat(follow_symlinks=False)
                    kind = stat.S_IFMT(st.st_mode)
                    if kind == stat.S_IFDIR:
                        pending.append((source, relative + "/"))
                    elif kind not in (stat.S_IFREG, stat.S_IFLNK):
                        name = _FILE_TYPE_NAMES.get(kind, f"file type {kind:#o}")
                        raise SourceError(f"cannot publish {relative!r}: it is a {name}")
                    found.append(_Found(relative, source, st))
        except OSError as exc:
            where = prefix.rstrip("/") or str(root)
            raise SourceError(f"cannot read {where!r}: {exc.strerror or exc}") from exc
    found.sort(key=lambda member: member.path)
    return found


@dataclass(slots=True)
class _Tally:
    """Blocks and bytes newly stored by one publish."""

    new_blocks: int = 0
    new_bytes: int = 0


def _store_block(store: BlobStore, block: Block, tally: _Tally) -> None:
    try:
        stored = store.put(block.digest, block.data)
    except OSError as exc:
        raise HubError(f"cannot store block {block.digest}: {exc.strerror or exc}") from exc
    if stored:
        tally.new_blocks += 1
        tally.new_bytes += len(block.data)


def _file_entry(member: _Found, store: BlobStore, block_size: int, tally: _Tally) -> ManifestEntry:
    """Stores a regular file's blocks (streaming, one block in memory) and describes it."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(member.source, flags)
    except OSError as exc:
        raise SourceError(f"cannot read {member.path!r}: {exc.strerror or exc}") from exc
    with open(fd, "rb") as stream:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode) or before.st_ino != member.stat.st_ino:
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
            _store_block(store, block, tally)
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


def _symlink_entry(member: _Found) -> ManifestEntry:
    try:
        target = os.readlink(member.source)
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
        mode=stat.S_IMODE(member.stat.st_mode),
        size=size,
        mtime_ns=member.stat.st_mtime_ns,
        symlink_target=target,
    )


def publish(
    data_dir: str | os.PathLike[str],
    dataset: str,
    src_dir: str | os.PathLike[str],
    tag: str | None = "latest",
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> PublishResult:
    """Publishes a directory tree as the next version of a dataset.

    Regular files, directories (empty ones included) and symlinks (stored with their
    target, not followed) are recorded with their permission bits, size and mtime;
    any other file type is refused. The data directory is created when missing.

    Args:
        data_dir: The hub's data directory.
        dataset: The dataset's name; created by its first publish.
        src_dir: The tree to publish; its contents become the snapshot's root.
        tag: A tag to point at the new version (default ``"latest"``), or None.
        block_size: Maximum block length, bytes (default 4 MiB).

    Returns:
        What was published; see :class:`PublishResult`.

    Raises:
        InvalidName: ``dataset`` or ``tag`` is malformed.
        InvalidArgument: ``block_size`` is out of range.
        SourceError: ``src_dir`` is missing, not a directory, unreadable, holds an
            unsupported file type or a non-UTF-8 name, or changed while being read.
        DataDirNotFound: ``data_dir`` exists but is not a directory.
        CatalogError: The catalog cannot be opened or written.
    """
    validate_dataset(dataset)
    if tag is not None:
        validate_tag(tag)
    validate_block_size(block_size)
    root = Path(src_dir)
    if not root.exists():
        raise SourceError(f"source dir {root} does not exist")
    if not root.is_dir():
        raise SourceError(f"source {root} is not a directory")

    layout = DataDir.open(data_dir, create=True)
    members = _scan(root)
    try:
        store = LocalBlobStore(layout.blobs_path)
    except OSError as exc:
        raise HubError(f"cannot open blob store {layout.blobs_path}: {exc.strerror}") from exc
    tally = _Tally()
    entries = []
    for member in members:
        kind = stat.S_IFMT(member.stat.st_mode)
        if kind == stat.S_IFREG:
            entries.append(_file_entry(member, store, block_size, tally))
        elif kind == stat.S_IFLNK:
            entries.append(_symlink_entry(member))
        else:
            entries.append(
                ManifestEntry(
                    path=member.path,
                    type=EntryType.DIRECTORY,
                    mode=stat.S_IMODE(member.stat.st_mode),
                    size=0,
                    mtime_ns=member.stat.st_mtime_ns,
                )
            )
    try:
        store.sync()
    except OSError as exc:
        raise HubError(f"cannot sync blob store {layout.blobs_path}: {exc.strerror}") from exc
    with Catalog(layout.catalog_path) as catalog:
        snapshot = catalog.add_version(dataset, block_size, entries, tag=tag)
    return PublishResult(
        dataset=dataset,
        version=snapshot.version,
        snapshot_id=snapshot.snapshot_id,
        files=snapshot.file_count,
        bytes=snapshot.total_bytes,
        new_blocks=tally.new_blocks,
        new_bytes=tally.new_bytes,
    )
