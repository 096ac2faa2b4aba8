"""The catalog: datasets, versions, tags, snapshots and manifests in LMDB.

Records (named LMDB databases; integers big-endian, names UTF-8):

============  =================================  ===========================================
database      key                                value
============  =================================  ===========================================
datasets      dataset                            last_version u32 | created_ns i64
versions      dataset NUL version u32            snapshot_id (16 raw bytes) | created_ns i64
tags          dataset NUL tag                    version u32
snapshots     snapshot_id (16 raw bytes)         block_size u32 | file_count u64
                                                 | total_bytes u64 | entry_count u64
manifests     snapshot_id (16 raw) | index u64   canonical entry (hub.manifest.encode_entry)
============  =================================  ===========================================

Manifest entries are keyed by their index in path order rather than by path: LMDB keys
are at most 511 bytes while a path may be 4095, and the index keeps path order.
Reading a manifest is a cursor walk, one bounded page per read transaction, so no reader
ever holds a whole manifest. Snapshots with equal ids share one manifest.

Concurrency: all writes happen in single LMDB write transactions (one writer at a time,
across processes), so a version number is assigned exactly once and a failed publish
leaves nothing behind. Every read opens a fresh read transaction and therefore sees the
latest committed state, including publishes by other processes. Versions, snapshots and
manifests are written once and never modified; tags are the only records that change.
LMDB forbids opening one environment twice in a process, so :class:`Catalog` objects on
the same directory share one environment (reference counted).
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import lmdb

from hub.errors import CatalogError, CorruptCatalog, DatasetNotFound, RefNotFound, SnapshotNotFound
from hub.manifest import EntryType, ManifestEntry, ManifestHasher, decode_entry
from hub.names import (
    is_version,
    validate_dataset,
    validate_digest,
    validate_ref,
    validate_tag,
    version_name,
    version_number,
)

DEFAULT_MAP_SIZE = 64 * 1024**3
"""LMDB map size, bytes (64 GiB of address space; the file grows only as data is written)."""

MANIFEST_PAGE_ENTRIES = 512
"""Manifest entries read per read transaction by :meth:`Catalog.iter_manifest`."""

_DATASET = struct.Struct(">Iq")
_VERSION_KEY = struct.Struct(">I")
_VERSION = struct.Struct(">16sq")
_TAG = struct.Struct(">I")
_SNAPSHOT = struct.Struct(">IQQQ")
_INDEX = struct.Struct(">Q")
_DB_NAMES = (b"datasets", b"versions", b"tags", b"snapshots", b"manifests")


@dataclass(frozen=True, slots=True)
class Dataset:
    """A dataset as listed by the catalog.

    Attributes:
        name: The dataset's name.
        version_count: Number of versions.
        latest_version: The newest version's name, e.g. ``"v3"``.
    """

    name: str
    version_count: int
    latest_version: str


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One version of a dataset.

    Attributes:
        dataset: The dataset's name.
        version: The version's name, e.g. ``"v3"``.
        snapshot_id: xxh3-128 of the canonical manifest, 32 lowercase hex characters.
        created_ns: Publish time, nanoseconds since the Unix epoch.
        block_size: Maximum block length, bytes.
        file_count: Number of regular files.
        total_bytes: Sum of regular file sizes, bytes.
        entry_count: Number of manifest entries (files, directories and symlinks).
    """

    dataset: str
    version: str
    snapshot_id: str
    created_ns: int
    block_size: int
    file_count: int
    total_bytes: int
    entry_count: int


@dataclass(frozen=True, slots=True)
class Tag:
    """A movable name for a version.

    Attributes:
        name: The tag, e.g. ``"latest"``.
        version: The version it points at, e.g. ``"v3"``.
    """

    name: str
    version: str


class _SharedEnv:
    """One LMDB environment and its named databases, shared by the catalogs of a process."""

    def __init__(self, env: lmdb.Environment, dbs: dict[bytes, lmdb._Database]) -> None:
        self.env = env
        self.dbs = dbs
        self.refs = 0


_shared_envs: dict[Path, _SharedEnv] = {}
_shared_envs_lock = threading.Lock()


def _acquire_env(path: Path, *, create: bool, map_size: int) -> tuple[Path, _SharedEnv]:
    """Opens (or shares) the environment at ``path``; release with :func:`_release_env`."""
    if not create and not (path / "data.mdb").is_file():
        raise CatalogError(f"no catalog at {path} (nothing published yet?)")
    with _shared_envs_lock:
        key = path.resolve()
        shared = _shared_envs.get(key)
        if shared is None:
            try:
                if create:
                    path.mkdir(parents=True, exist_ok=True)
                env = lmdb.open(
                    str(path), map_size=map_size, max_dbs=len(_DB_NAMES), subdir=True, create=create
                )
                try:
                    with env.begin(write=True) as txn:
                        dbs = {name: env.open_db(name, txn=txn) for name in _DB_NAMES}
                except BaseException:
                    env.close()
                    raise
            except (lmdb.Error, OSError) as exc:
                raise CatalogError(f"cannot open catalog at {path}: {exc}") from exc
            shared = _SharedEnv(env, dbs)
            _shared_envs[key] = shared
        shared.refs += 1
        return key, shared


def _release_env(key: Path) -> None:
    """Drops one reference to a shared environment, closing it with the last one."""
    with _shared_envs_lock:
        shared = _shared_envs[key]
        shared.refs -= 1
        if shared.refs == 0:
            del _shared_envs[key]
            shared.env.close()


def _prefix(dataset: str) -> bytes:
    return dataset.encode("utf-8") + b"\0"


def _version_key(dataset: str, number: int) -> bytes:
    return _prefix(dataset) + _VERSION_KEY.pack(number)


class Catalog:
    """The hub's catalog in an LMDB environment (``DATA_DIR/catalog``).

    Safe to use from several threads; every method runs its own transaction. Use as a
    context manager or call :meth:`close`.

    Args:
        path: The environment directory.
        create: Create the environment when missing; when False a missing catalog raises.
        map_size: LMDB map size, bytes; the upper bound of the catalog's size.

    Raises:
        CatalogError: The catalog does not exist (``create`` False) or cannot be opened.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        create: bool = True,
        map_size: int = DEFAULT_MAP_SIZE,
    ) -> None:
        self.path = Path(path)
        self._key, shared = _acquire_env(self.path, create=create, map_size=map_size)
        self._env: lmdb.Environment | None = shared.env
        self._datasets = shared.dbs[b"datasets"]
        self._versions = shared.dbs[b"versions"]
        self._tags = shared.dbs[b"tags"]
        self._snapshots = shared.dbs[b"snapshots"]
        self._manifests = shared.dbs[b"manifests"]

    def close(self) -> None:
        """Releases the environment; further calls fail. Repeated calls have no effect."""
        if self._env is not None:
            self._env = None
            _release_env(self._key)

    def __enter__(self) -> Catalog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def env(self) -> lmdb.Environment:
        """The open LMDB environment.

        Raises:
            CatalogError: The catalog was closed.
        """
        if self._env is None:
            raise CatalogError(f"catalog at {self.path} is closed")
        return self._env

    # Reading.

    def list_datasets(self) -> list[Dataset]:
        """Lists every dataset, in name order.

        Returns:
            One :class:`Dataset` per dataset.
        """
        with self.env.begin() as txn:
            names = [key.decode("utf-8") for key, _ in txn.cursor(db=self._datasets)]
            return [self._dataset(txn, name) for name in names]

    def dataset(self, name: str) -> Dataset:
        """Describes one dataset.

        Raises:
            InvalidName: ``name`` is malformed.
            DatasetNotFound: There is no such dataset.
        """
        validate_dataset(name)
        with self.env.begin() as txn:
            return self._dataset(txn, name)

    def list_versions(self, dataset: str) -> list[Snapshot]:
        """Lists a dataset's versions, oldest first.

        Raises:
            InvalidName: ``dataset`` is malformed.
            DatasetNotFound: There is no such dataset.
        """
        validate_dataset(dataset)
        with self.env.begin() as txn:
            self._require_dataset(txn, dataset)
            prefix = _prefix(dataset)
            cursor = txn.cursor(db=self._versions)
            snapshots = []
            if cursor.set_range(prefix):
                for key, value in cursor:
                    if not key.startswith(prefix):
                        break
                    (number,) = _VERSION_KEY.unpack(key[len(prefix) :])
                    snapshots.append(self._snapshot(txn, dataset, number, value))
            return snapshots

    def list_tags(self, dataset: str) -> list[Tag]:
        """Lists a dataset's tags, in name order.

        Raises:
            InvalidName: ``dataset`` is malformed.
            DatasetNotFound: There is no such dataset.
        """
        validate_dataset(dataset)
        with self.env.begin() as txn:
            self._require_dataset(txn, dataset)
            prefix = _prefix(dataset)
            cursor = txn.cursor(db=self._tags)
            tags = []
            if cursor.set_range(prefix):
                for key, value in cursor:
                    if not key.startswith(prefix):
                        break
                    (number,) = _TAG.unpack(value)
                    tags.append(Tag(key[len(prefix) :].decode("utf-8"), version_name(number)))
            return tags

    def resolve(self, dataset: str, ref: str) -> Snapshot:
        """Resolves a version (``"v3"``) or a tag (``"latest"``) to its snapshot.

        Args:
            dataset: The dataset's name.
            ref: A version or tag name.

        Returns:
            The snapshot.

        Raises:
            InvalidName: ``dataset`` or ``ref`` is malformed.
            DatasetNotFound: There is no such dataset.
            RefNotFound: The dataset has no such version or tag.
        """
        validate_dataset(dataset)
        validate_ref(ref)
        with self.env.begin() as txn:
            self._require_dataset(txn, dataset)
            number = self._resolve_number(txn, dataset, ref)
            value = txn.get(_version_key(dataset, number), db=self._versions)
            if value is None:
                raise RefNotFound(f"dataset {dataset!r} has no version {ref}")
            return self._snapshot(txn, dataset, number, value)

    def manifest_page(self, snapshot_id: str, start: int, limit: int) -> list[ManifestEntry]:
        """Reads a run of manifest entries in path order, in one read transaction.

        Args:
            snapshot_id: The snapshot's id.
            start: Index (in path order) of the first entry to return.
            limit: Maximum number of entries to return.

        Returns:
            Up to ``limit`` entries; fewer (possibly none) at the manifest's end.

        Raises:
            InvalidDigest: ``snapshot_id`` is malformed.
            SnapshotNotFound: No manifest is stored under ``snapshot_id``.
            CorruptCatalog: An entry cannot be decoded.
        """
        raw_id = bytes.fromhex(validate_digest(snapshot_id))
        with self.env.begin() as txn:
            if txn.get(raw_id, db=self._snapshots) is None:
                raise SnapshotNotFound(f"unknown snapshot {snapshot_id}")
            cursor = txn.cursor(db=self._manifests)
            entries: list[ManifestEntry] = []
            if limit <= 0 or not cursor.set_range(raw_id + _INDEX.pack(start)):
                return entries
            for key, value in cursor:
                if not key.startswith(raw_id) or len(entries) >= limit:
                    break
                entries.append(decode_entry(value))
            return entries

    def iter_manifest(
        self, snapshot_id: str, page_entries: int = MANIFEST_PAGE_ENTRIES
    ) -> Iterator[ManifestEntry]:
        """Iterates a manifest in path order, one page (read transaction) at a time.

        Args:
            snapshot_id: The snapshot's id.
            page_entries: Entries read per transaction.

        Yields:
            The manifest's entries in path order.

        Raises:
            InvalidDigest: ``snapshot_id`` is malformed.
            SnapshotNotFound: No manifest is stored under ``snapshot_id``.
        """
        start = 0
        while page := self.manifest_page(snapshot_id, start, page_entries):
            yield from page
            start += len(page)

    # Writing.

    def add_version(
        self,
        dataset: str,
        block_size: int,
        entries: Sequence[ManifestEntry],
        *,
        tag: str | None = "latest",
        created_ns: int | None = None,
    ) -> Snapshot:
        """Records a new version of a dataset, in one write transaction.

        Creates the dataset if needed, assigns the next version number, stores the
        snapshot and its manifest (unless a snapshot with the same id exists) and points
        ``tag`` at the new version. On any error nothing is written.

        Args:
            dataset: The dataset's name.
            block_size: The snapshot's maximum block length, bytes.
            entries: The manifest, in path order. The blocks must already be stored.
            tag: A tag to point at the new version, or None.
            created_ns: Publish time, nanoseconds since the Unix epoch; default now.

        Returns:
            The new version's snapshot.

        Raises:
            InvalidName: ``dataset`` or ``tag`` is malformed.
            InvalidArgument: ``block_size`` is out of range.
            ValueError: ``entries`` are out of path order or repeat a path.
            CatalogError: The catalog is full or cannot be written.
        """
        validate_dataset(dataset)
        if tag is not None:
            validate_tag(tag)
        hasher = ManifestHasher(block_size)
        encoded = [hasher.add(entry) for entry in entries]
        sid = hasher.hexdigest()
        raw_id = bytes.fromhex(sid)
        files = [entry for entry in entries if entry.type == EntryType.FILE]
        snapshot_record = _SNAPSHOT.pack(
            block_size, len(files), sum(entry.size for entry in files), len(entries)
        )
        created = time.time_ns() if created_ns is None else created_ns
        try:
            with self.env.begin(write=True) as txn:
                record = txn.get(dataset.encode("utf-8"), db=self._datasets)
                if record is None:
                    last, dataset_created = 0, created
                else:
                    last, dataset_created = _DATASET.unpack(record)
                number = last + 1
                version_name(number)  # range check
                if txn.get(raw_id, db=self._snapshots) is None:
                    txn.put(raw_id, snapshot_record, db=self._snapshots)
                    for index, entry_bytes in enumerate(encoded):
                        txn.put(raw_id + _INDEX.pack(index), entry_bytes, db=self._manifests)
                if not txn.put(
                    _version_key(dataset, number),
                    _VERSION.pack(raw_id, created),
                    db=self._versions,
                    overwrite=False,
                ):
                    raise CorruptCatalog(f"dataset {dataset!r} already has v{number}")
                txn.put(
                    dataset.encode("utf-8"),
                    _DATASET.pack(number, dataset_created),
                    db=self._datasets,
                )
                if tag is not None:
                    txn.put(
                        _prefix(dataset) + tag.encode("utf-8"), _TAG.pack(number), db=self._tags
                    )
                return self._snapshot(txn, dataset, number, _VERSION.pack(raw_id, created))
        except lmdb.MapFullError as exc:
            raise CatalogError(
                f"catalog at {self.path} is full ({exc}); reopen it with a larger map size"
            ) from exc
        except lmdb.Error as exc:
            raise CatalogError(f"cannot write catalog at {self.path}: {exc}") from exc

    def set_tag(self, dataset: str, tag: str, ref: str) -> Tag:
        """Points a tag at a version, creating or moving it.

        Args:
            dataset: The dataset's name.
            tag: The tag to set.
            ref: The version (or another tag, resolved now) to point at.

        Returns:
            The tag as stored.

        Raises:
            InvalidName: ``dataset``, ``tag`` or ``ref`` is malformed.
            DatasetNotFound: There is no such dataset.
            RefNotFound: ``ref`` names no version of the dataset.
            CatalogError: The catalog cannot be written.
        """
        validate_dataset(dataset)
        validate_tag(tag)
        validate_ref(ref)
        try:
            with self.env.begin(write=True) as txn:
                self._require_dataset(txn, dataset)
                number = self._resolve_number(txn, dataset, ref)
                if txn.get(_version_key(dataset, number), db=self._versions) is None:
                    raise RefNotFound(f"dataset {dataset!r} has no version {ref}")
                txn.put(_prefix(dataset) + tag.encode("utf-8"), _TAG.pack(number), db=self._tags)
        except lmdb.Error as exc:
            raise CatalogError(f"cannot write catalog at {self.path}: {exc}") from exc
        return Tag(tag, version_name(number))

    # Helpers, all inside a caller's transaction.

    def _require_dataset(self, txn: lmdb.Transaction[bytes], dataset: str) -> bytes:
        record = txn.get(dataset.encode("utf-8"), db=self._datasets)
        if record is None:
            raise DatasetNotFound(f"unknown dataset {dataset!r}")
        return record

    def _dataset(self, txn: lmdb.Transaction[bytes], name: str) -> Dataset:
        self._require_dataset(txn, name)
        prefix = _prefix(name)
        cursor = txn.cursor(db=self._versions)
        count, latest = 0, 0
        if cursor.set_range(prefix):
            for key in cursor.iternext(keys=True, values=False):
                if not key.startswith(prefix):
                    break
                count += 1
                (latest,) = _VERSION_KEY.unpack(key[len(prefix) :])
        return Dataset(name, count, version_name(latest) if latest else "")

    def _resolve_number(self, txn: lmdb.Transaction[bytes], dataset: str, ref: str) -> int:
        if is_version(ref):
            return version_number(ref)
        value = txn.get(_prefix(dataset) + ref.encode("utf-8"), db=self._tags)
        if value is None:
            raise RefNotFound(f"dataset {dataset!r} has no tag {ref!r}")
        (number,) = _TAG.unpack(value)
        return int(number)

    def _snapshot(
        self, txn: lmdb.Transaction[bytes], dataset: str, number: int, value: bytes
    ) -> Snapshot:
        try:
            raw_id, created_ns = _VERSION.unpack(value)
            record = txn.get(raw_id, db=self._snapshots)
            if record is None:
                raise CorruptCatalog(f"{dataset} v{number}: snapshot {raw_id.hex()} is missing")
            block_size, file_count, total_bytes, entry_count = _SNAPSHOT.unpack(record)
        except struct.error as exc:
            raise CorruptCatalog(f"{dataset} v{number}: corrupt record: {exc}") from exc
        return Snapshot(
            dataset=dataset,
            version=version_name(number),
            snapshot_id=raw_id.hex(),
            created_ns=created_ns,
            block_size=block_size,
            file_count=file_count,
            total_bytes=total_bytes,
            entry_count=entry_count,
        )
