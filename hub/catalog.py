"""The catalog: datasets, versions, tags, snapshots, manifests and events in LMDB.

Records (named LMDB databases; integers big-endian, names UTF-8, digests raw 16 bytes):

==========  ==========================================  =====================================
database    key                                         value
==========  ==========================================  =====================================
meta        ``format`` / ``last_sequence`` /            u32 / u64 / u64 / blob store URL
            ``next_manifest`` / ``blobs``
datasets    dataset                                     last_version u32 | created_ns i64
versions    dataset NUL version u32                     snapshot_id | created_ns i64
revoked     dataset NUL version u32                     revoked_ns i64
tags        dataset NUL tag                             version u32
snapshots   snapshot_id                                 block_size u32 | file_count u64
                                                        | total_bytes u64 | entry_count u64
                                                        | manifest u64 | live_versions u32
manifests   manifest u64 | index u64                    canonical entry (hub.manifest)
dirs        manifest u64 | xxh3-128(parent) | name      index u64
blocks      digest                                      live references u64 | size u32
block_refs  digest | dataset                            live references u64
pending     digest | publish u64                        (empty)
publishes   publish u64                                 started_ns i64 | pid u32 | host
events      sequence u64                                event record (hub.events)
==========  ==========================================  =====================================

**Immutability.** A version record is written once (``put(overwrite=False)``) and never
changed; its snapshot id is the xxh3-128 digest of the canonical manifest, so
:meth:`Catalog.manifest_digest` can prove at any time that the stored manifest is the one
published. Revoking a version adds a ``revoked`` record; it never edits the version.
Tags are the only records that move. Version numbers are never reused.

**Manifests** are keyed by a manifest number and their index in path order (LMDB keys are
at most 511 bytes, a path may be 4095). The ``dirs`` index maps (parent directory, name)
to the entry's index, so one directory is listed by a range scan over its children
without reading the rest of the manifest. Snapshots with equal ids share one manifest.

**Publishing** (:class:`PublishSession`) is staged: entries are written in small
transactions under a fresh manifest number no snapshot points at yet, so a publish of a
million files never holds its manifest in memory nor the writer lock for long. The
final :meth:`PublishSession.commit` is one write transaction that creates the version,
its snapshot (or shares an identical one and drops the staged copy), the tag, the block
references and the events. Before a publish stores a block it *protects* the digest
(``pending``), so garbage collection never deletes a block that a publish in flight is
about to rely on; commit turns protections into references.

**Block references.** ``blocks`` counts, per digest, its occurrences in the manifests of
live (unrevoked) versions; ``block_refs`` splits the count by dataset. A digest absent
from ``blocks`` and from ``pending`` is garbage. ``block_refs`` answers "may a caller who
reads these datasets read this block?" with one range lookup.

**Events** are appended in the same transaction as the change they report, under
``last_sequence + 1`` (:mod:`hub.events`).

**Concurrency.** All writes happen in LMDB write transactions (one writer at a time,
across processes); every read opens a fresh read transaction and so sees the latest
commit, including those of other processes. LMDB forbids opening one environment twice
in a process, so :class:`Catalog` objects on one directory share an environment
(reference counted). Source: LMDB's documentation, http://www.lmdb.tech/doc/.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import lmdb
import xxhash

from hub.errors import (
    CatalogError,
    Conflict,
    CorruptCatalog,
    DatasetNotFound,
    InvalidArgument,
    NotADirectory,
    PathNotFound,
    RefNotFound,
    SnapshotNotFound,
    VersionExists,
    VersionRevoked,
)
from hub.events import Event, EventKind, decode_event, encode_event
from hub.manifest import (
    FORMAT,
    HEADER_MAGIC,
    EntryType,
    ManifestEntry,
    ManifestHasher,
    decode_block_refs,
    decode_entry,
    validate_path,
)
from hub.names import (
    is_version,
    validate_dataset,
    validate_digest,
    validate_ref,
    validate_tag,
    version_name,
    version_number,
)

CATALOG_FORMAT = 2
"""On-disk format of the catalog's records; a catalog of another format is refused."""

DEFAULT_MAP_SIZE = 64 * 1024**3
"""LMDB map size, bytes (64 GiB of address space; the file grows only as data is written)."""

MANIFEST_PAGE_ENTRIES = 512
"""Manifest entries read per read transaction by :meth:`Catalog.iter_manifest`."""

STAGE_ENTRIES = 1024
"""Manifest entries a publish buffers before writing them in one staging transaction."""

_DATASET = struct.Struct(">Iq")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_VERSION = struct.Struct(">16sq")
_SNAPSHOT = struct.Struct(">IQQQQI")
_BLOCK = struct.Struct(">QI")
_PUBLISH = struct.Struct(">qI")
_HEADER = struct.Struct(">HI")
_ENTRY_LENGTH = struct.Struct(">Q")
_DB_NAMES = (
    b"meta",
    b"datasets",
    b"versions",
    b"revoked",
    b"tags",
    b"snapshots",
    b"manifests",
    b"dirs",
    b"blocks",
    b"block_refs",
    b"pending",
    b"publishes",
    b"events",
)
_META_FORMAT = b"format"
_META_SEQUENCE = b"last_sequence"
_META_MANIFEST = b"next_manifest"
_META_BLOBS = b"blobs"

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Dataset:
    """A dataset as listed by the catalog.

    Attributes:
        name: The dataset's name.
        version_count: Number of live (unrevoked) versions.
        latest_version: The newest live version's name, e.g. ``"v3"``; empty when none.
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
        revoked_ns: When the version was revoked, nanoseconds since the Unix epoch; 0
            while it is live.
    """

    dataset: str
    version: str
    snapshot_id: str
    created_ns: int
    block_size: int
    file_count: int
    total_bytes: int
    entry_count: int
    revoked_ns: int = 0

    @property
    def revoked(self) -> bool:
        """True once the version was revoked."""
        return self.revoked_ns != 0


@dataclass(frozen=True, slots=True)
class Tag:
    """A movable name for a version.

    Attributes:
        name: The tag, e.g. ``"latest"``.
        version: The version it points at, e.g. ``"v3"``.
    """

    name: str
    version: str


@dataclass(frozen=True, slots=True)
class Revocation:
    """What revoking a version did.

    Attributes:
        snapshot: The version, now revoked.
        removed_tags: Tags that pointed at it and were removed, in name order.
        manifest_dropped: True when no live version shares the snapshot any more, so its
            manifest was deleted.
    """

    snapshot: Snapshot
    removed_tags: tuple[str, ...]
    manifest_dropped: bool


@dataclass(frozen=True, slots=True)
class PublishRecord:
    """A publish in progress (or abandoned by a crashed process).

    Attributes:
        publish_id: The publish's number (also its staged manifest's number).
        started_ns: When it began, nanoseconds since the Unix epoch.
        pid: The publishing process's id.
        host: The publishing machine's host name.
    """

    publish_id: int
    started_ns: int
    pid: int
    host: str


@dataclass(frozen=True, slots=True)
class CatalogStats:
    """Sizes of the catalog, for metrics.

    Attributes:
        datasets: Datasets.
        versions: Versions ever published (live and revoked).
        revoked_versions: Revoked versions.
        tags: Tags.
        snapshots: Distinct snapshots with a live version.
        blocks: Distinct blocks referenced by live versions.
        block_bytes: Bytes of those blocks.
        publishes_in_progress: Publishes staged but not committed (or abandoned).
        last_sequence: Sequence number of the newest event (0 when none).
        map_used_bytes: Bytes of the LMDB map in use.
    """

    datasets: int
    versions: int
    revoked_versions: int
    tags: int
    snapshots: int
    blocks: int
    block_bytes: int
    publishes_in_progress: int
    last_sequence: int
    map_used_bytes: int


class _SharedEnv:
    """One LMDB environment and its named databases, shared by the catalogs of a process."""

    def __init__(self, env: lmdb.Environment, dbs: dict[bytes, lmdb._Database]) -> None:
        self.env = env
        self.dbs = dbs
        self.refs = 0


_shared_envs: dict[Path, _SharedEnv] = {}
_shared_envs_lock = threading.Lock()


def _check_format(
    txn: lmdb.Transaction[bytes], meta: lmdb._Database, datasets: lmdb._Database, path: Path
) -> None:
    """Stamps a new catalog with :data:`CATALOG_FORMAT`; refuses one of another format."""
    stamp = txn.get(_META_FORMAT, db=meta)
    if stamp is None:
        if txn.stat(datasets)["entries"]:
            raise CatalogError(
                f"catalog at {path} has no format stamp (written by an older hub); "
                f"this hub reads format {CATALOG_FORMAT}"
            )
        txn.put(_META_FORMAT, _U32.pack(CATALOG_FORMAT), db=meta)
        return
    (found,) = _U32.unpack(stamp)
    if found != CATALOG_FORMAT:
        raise CatalogError(
            f"catalog at {path} has format {found}; this hub reads format {CATALOG_FORMAT}"
        )


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
                        _check_format(txn, dbs[b"meta"], dbs[b"datasets"], path)
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
    return _prefix(dataset) + _U32.pack(number)


def _dir_hash(directory: str) -> bytes:
    """The 16-byte key part naming a directory (its path's xxh3-128; ``""`` is the root)."""
    return xxhash.xxh3_128_digest(directory.encode("utf-8"))


def _split(path: str) -> tuple[str, str]:
    """``"a/b/c"`` -> ``("a/b", "c")``; ``"c"`` -> ``("", "c")``."""
    parent, _, name = path.rpartition("/")
    return parent, name


def _dir_key(manifest: int, path: str) -> bytes:
    parent, name = _split(path)
    return _U64.pack(manifest) + _dir_hash(parent) + name.encode("utf-8")


def _iter_prefix(cursor: lmdb.Cursor[bytes], prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
    """Yields the (key, value) pairs whose key starts with ``prefix``, in key order."""
    if not cursor.set_range(prefix):
        return
    for key, value in cursor:
        if not key.startswith(prefix):
            return
        yield key, value


def _delete_prefix(cursor: lmdb.Cursor[bytes], prefix: bytes) -> int:
    """Deletes every key that starts with ``prefix``; returns how many."""
    deleted = 0
    if not cursor.set_range(prefix):
        return 0
    while cursor.key().startswith(prefix):
        if not cursor.delete():
            break
        deleted += 1
    return deleted


def _add_count(txn: lmdb.Transaction[bytes], db: lmdb._Database, key: bytes, delta: int) -> int:
    """Adds ``delta`` to a u64 counter record (deleting it at 0); returns the new count."""
    value = txn.get(key, db=db)
    count = (_U64.unpack(value[:8])[0] if value is not None else 0) + delta
    if count < 0:
        raise CorruptCatalog(f"reference count of {key.hex()} would drop below zero")
    if count == 0:
        txn.delete(key, db=db)
    else:
        txn.put(key, _U64.pack(count) + (value[8:] if value is not None else b""), db=db)
    return count


class Catalog:
    """The hub's catalog in an LMDB environment (``DATA_DIR/catalog``).

    Safe to use from several threads; every method runs its own transaction. Use as a
    context manager or call :meth:`close`.

    Args:
        path: The environment directory.
        create: Create the environment when missing; when False a missing catalog raises.
        map_size: LMDB map size, bytes; the upper bound of the catalog's size.

    Raises:
        CatalogError: The catalog does not exist (``create`` False), cannot be opened, or
            was written in another format.
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
        self._db = shared.dbs

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

    @contextlib.contextmanager
    def _write(self) -> Iterator[lmdb.Transaction[bytes]]:
        """A write transaction; LMDB failures become :class:`CatalogError`."""
        try:
            with self.env.begin(write=True) as txn:
                yield txn
        except lmdb.MapFullError as exc:
            raise CatalogError(
                f"catalog at {self.path} is full ({exc}); reopen it with a larger map size"
            ) from exc
        except lmdb.Error as exc:
            raise CatalogError(f"cannot write catalog at {self.path}: {exc}") from exc

    # Reading.

    def list_datasets(self) -> list[Dataset]:
        """Lists every dataset, in name order.

        Returns:
            One :class:`Dataset` per dataset.
        """
        with self.env.begin() as txn:
            names = [key.decode("utf-8") for key, _ in txn.cursor(db=self._db[b"datasets"])]
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

    def list_versions(self, dataset: str, *, include_revoked: bool = False) -> list[Snapshot]:
        """Lists a dataset's versions, oldest first.

        Args:
            dataset: The dataset's name.
            include_revoked: Also list revoked versions (with ``revoked_ns`` set).

        Raises:
            InvalidName: ``dataset`` is malformed.
            DatasetNotFound: There is no such dataset.
        """
        validate_dataset(dataset)
        with self.env.begin() as txn:
            self._require_dataset(txn, dataset)
            prefix = _prefix(dataset)
            snapshots = []
            for key, value in _iter_prefix(txn.cursor(db=self._db[b"versions"]), prefix):
                (number,) = _U32.unpack(key[len(prefix) :])
                snapshot = self._snapshot(txn, dataset, number, value)
                if include_revoked or not snapshot.revoked:
                    snapshots.append(snapshot)
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
            return [
                Tag(key[len(prefix) :].decode("utf-8"), version_name(_U32.unpack(value)[0]))
                for key, value in _iter_prefix(txn.cursor(db=self._db[b"tags"]), prefix)
            ]

    def resolve(self, dataset: str, ref: str) -> Snapshot:
        """Resolves a version (``"v3"``) or a tag (``"latest"``) to its live snapshot.

        Args:
            dataset: The dataset's name.
            ref: A version or tag name.

        Returns:
            The snapshot.

        Raises:
            InvalidName: ``dataset`` or ``ref`` is malformed.
            DatasetNotFound: There is no such dataset.
            RefNotFound: The dataset has no such version or tag.
            VersionRevoked: The version was revoked.
        """
        validate_dataset(dataset)
        validate_ref(ref)
        with self.env.begin() as txn:
            self._require_dataset(txn, dataset)
            snapshot = self._version(txn, dataset, self._resolve_number(txn, dataset, ref))
        if snapshot.revoked:
            raise VersionRevoked(f"{dataset} {snapshot.version} was revoked")
        return snapshot

    def version(self, dataset: str, number: int) -> Snapshot:
        """Looks up one version by number, revoked or not.

        Args:
            dataset: The dataset's name.
            number: The version number, e.g. 3 for ``v3``.

        Raises:
            InvalidName: ``dataset`` is malformed.
            DatasetNotFound: There is no such dataset.
            RefNotFound: The dataset has no such version.
        """
        validate_dataset(dataset)
        with self.env.begin() as txn:
            self._require_dataset(txn, dataset)
            return self._version(txn, dataset, number)

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
            SnapshotNotFound: No live manifest is stored under ``snapshot_id``.
            CorruptCatalog: An entry cannot be decoded.
        """
        with self.env.begin() as txn:
            manifest = self._manifest_number(txn, snapshot_id)
            entries: list[ManifestEntry] = []
            if limit <= 0:
                return entries
            prefix = _U64.pack(manifest)
            cursor = txn.cursor(db=self._db[b"manifests"])
            if not cursor.set_range(prefix + _U64.pack(start)):
                return entries
            for key, value in cursor:
                if not key.startswith(prefix) or len(entries) >= limit:
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
            SnapshotNotFound: No live manifest is stored under ``snapshot_id``.
        """
        start = 0
        while page := self.manifest_page(snapshot_id, start, page_entries):
            yield from page
            start += len(page)

    def list_directory(
        self, snapshot_id: str, path: str, after: str = "", limit: int = 1000
    ) -> tuple[list[ManifestEntry], bool]:
        """Lists one directory of a snapshot through the ``dirs`` index, in name order.

        Reads the directory's own entry and its children only: a range scan over the
        index keys ``manifest | xxh3-128(path) | name`` and one lookup per child.

        Args:
            snapshot_id: The snapshot's id.
            path: The directory, relative to the snapshot root; ``""`` is the root.
            after: Return only children whose name sorts after this one (paging).
            limit: Maximum number of children to return, at least 1.

        Returns:
            The children (full manifest entries) and whether more follow.

        Raises:
            InvalidDigest: ``snapshot_id`` is malformed.
            InvalidName: ``path`` is not a valid manifest path.
            SnapshotNotFound: No live manifest is stored under ``snapshot_id``.
            PathNotFound: The snapshot has no entry at ``path``.
            NotADirectory: ``path`` is a file or a symlink.
        """
        if path:
            validate_path(path)
        limit = max(1, limit)
        with self.env.begin() as txn:
            manifest = self._manifest_number(txn, snapshot_id)
            dirs = self._db[b"dirs"]
            if path:
                own = txn.get(_dir_key(manifest, path), db=dirs)
                if own is None:
                    raise PathNotFound(f"snapshot {snapshot_id} has no entry {path!r}")
                if self._entry(txn, manifest, own).type != EntryType.DIRECTORY:
                    raise NotADirectory(f"{path!r} is not a directory")
            prefix = _U64.pack(manifest) + _dir_hash(path)
            cursor = txn.cursor(db=dirs)
            start = prefix + after.encode("utf-8")
            children: list[ManifestEntry] = []
            if not cursor.set_range(start):
                return children, False
            for key, value in cursor:
                if not key.startswith(prefix):
                    return children, False
                if after and key == start:
                    continue
                if len(children) == limit:
                    return children, True
                entry = self._entry(txn, manifest, value)
                if _split(entry.path)[0] != path:
                    raise CorruptCatalog(f"directory index of {snapshot_id} is inconsistent")
                children.append(entry)
            return children, False

    def manifest_digest(self, snapshot_id: str) -> str:
        """Recomputes a snapshot id from the stored manifest (proof of immutability).

        Hashes the stored canonical entries exactly as :class:`~hub.manifest.ManifestHasher`
        did at publish time and decodes each one, so any change of a stored byte gives a
        different digest or a :class:`CorruptCatalog` error.

        Args:
            snapshot_id: The snapshot's id.

        Returns:
            The recomputed id; equal to ``snapshot_id`` when the manifest is intact.

        Raises:
            InvalidDigest: ``snapshot_id`` is malformed.
            SnapshotNotFound: No live manifest is stored under ``snapshot_id``.
            CorruptCatalog: An entry cannot be decoded or entries are out of path order.
        """
        raw_id = bytes.fromhex(validate_digest(snapshot_id))
        with self.env.begin() as txn:
            record = txn.get(raw_id, db=self._db[b"snapshots"])
            if record is None:
                raise SnapshotNotFound(f"unknown snapshot {snapshot_id}")
            block_size, _, _, entry_count, manifest, live = _SNAPSHOT.unpack(record)
            if not live:
                raise SnapshotNotFound(f"snapshot {snapshot_id} has no live version")
        digest = xxhash.xxh3_128()
        digest.update(HEADER_MAGIC + _HEADER.pack(FORMAT, block_size))
        count, last = 0, ""
        prefix = _U64.pack(manifest)
        while True:
            with self.env.begin() as txn:
                cursor = txn.cursor(db=self._db[b"manifests"])
                page: list[bytes] = []
                if cursor.set_range(prefix + _U64.pack(count)):
                    for key, value in cursor:
                        if not key.startswith(prefix) or len(page) >= MANIFEST_PAGE_ENTRIES:
                            break
                        page.append(value)
            for value in page:
                path = decode_entry(value).path
                if count and path <= last:
                    raise CorruptCatalog(f"manifest of {snapshot_id} is out of path order")
                last = path
                digest.update(_ENTRY_LENGTH.pack(len(value)))
                digest.update(value)
                count += 1
            if len(page) < MANIFEST_PAGE_ENTRIES:
                break
        if count != entry_count:
            raise CorruptCatalog(
                f"manifest of {snapshot_id} has {count} entries, its record says {entry_count}"
            )
        return digest.hexdigest()

    def block_size(self, digest: str, readable: Callable[[str], bool] | None = None) -> int | None:
        """Tells whether a block belongs to a live version the caller may read.

        Args:
            digest: The block's digest.
            readable: Tells whether the caller may read a dataset; None means every
                dataset.

        Returns:
            The block's length in bytes, or None when no live version of a readable
            dataset references it (unknown, revoked, or another dataset's block).

        Raises:
            InvalidDigest: ``digest`` is malformed.
        """
        raw = bytes.fromhex(validate_digest(digest))
        with self.env.begin() as txn:
            record = txn.get(raw, db=self._db[b"blocks"])
            if record is None:
                return None
            if readable is not None:
                refs = txn.cursor(db=self._db[b"block_refs"])
                if not any(
                    readable(key[16:].decode("utf-8")) for key, _ in _iter_prefix(refs, raw)
                ):
                    return None
            size: int = _BLOCK.unpack(record)[1]
            return size

    def is_live_or_pending(self, txn: lmdb.Transaction[bytes], digest: str) -> bool:
        """Tells, inside a caller's transaction, whether a block must be kept.

        Args:
            txn: A transaction on this catalog's environment.
            digest: The block's digest.

        Returns:
            True when a live version references the block or a publish protected it.
        """
        raw = bytes.fromhex(digest)
        if txn.get(raw, db=self._db[b"blocks"]) is not None:
            return True
        cursor = txn.cursor(db=self._db[b"pending"])
        return cursor.set_range(raw) and cursor.key().startswith(raw)

    def last_sequence(self) -> int:
        """The sequence number of the newest event; 0 when there is none (cheap)."""
        with self.env.begin() as txn:
            value = txn.get(_META_SEQUENCE, db=self._db[b"meta"])
            return _U64.unpack(value)[0] if value is not None else 0

    def first_sequence(self) -> int:
        """The oldest event still kept; ``last_sequence() + 1`` when none is kept."""
        with self.env.begin() as txn:
            cursor = txn.cursor(db=self._db[b"events"])
            if cursor.first():
                first: int = _U64.unpack(cursor.key())[0]
                return first
            value = txn.get(_META_SEQUENCE, db=self._db[b"meta"])
            return (_U64.unpack(value)[0] if value is not None else 0) + 1

    def events_after(self, sequence: int, limit: int = 1000) -> list[Event]:
        """Reads events with a sequence number greater than ``sequence``, oldest first.

        Args:
            sequence: The last sequence number the reader has seen (0 for the beginning).
            limit: Maximum number of events to return.

        Returns:
            Up to ``limit`` events.
        """
        with self.env.begin() as txn:
            cursor = txn.cursor(db=self._db[b"events"])
            events: list[Event] = []
            if not cursor.set_range(_U64.pack(sequence + 1)):
                return events
            for key, value in cursor:
                if len(events) >= limit:
                    break
                events.append(decode_event(_U64.unpack(key)[0], value))
            return events

    def list_publishes(self) -> list[PublishRecord]:
        """Lists publishes staged but not committed: in progress, or abandoned by a crash."""
        with self.env.begin() as txn:
            records = []
            for key, value in txn.cursor(db=self._db[b"publishes"]):
                started_ns, pid = _PUBLISH.unpack_from(value)
                host = value[_PUBLISH.size :].decode("utf-8")
                records.append(PublishRecord(_U64.unpack(key)[0], started_ns, pid, host))
            return records

    def blobs_location(self) -> str | None:
        """The blob store this catalog's blocks live in, as recorded by the first publish."""
        with self.env.begin() as txn:
            value = txn.get(_META_BLOBS, db=self._db[b"meta"])
            return value.decode("utf-8") if value is not None else None

    def stats(self) -> CatalogStats:
        """Counts the catalog's records (O(1) per database, from LMDB's own statistics)."""
        with self.env.begin() as txn:

            def entries(name: bytes) -> int:
                count: int = txn.stat(self._db[name])["entries"]
                return count

            meta = self._db[b"meta"]
            sequence = txn.get(_META_SEQUENCE, db=meta)
            block_bytes = txn.get(b"block_bytes", db=meta)
            live_snapshots = txn.get(b"live_snapshots", db=meta)
            info = self.env.info()
            stat = self.env.stat()
            return CatalogStats(
                datasets=entries(b"datasets"),
                versions=entries(b"versions"),
                revoked_versions=entries(b"revoked"),
                tags=entries(b"tags"),
                snapshots=_U64.unpack(live_snapshots)[0] if live_snapshots else 0,
                blocks=entries(b"blocks"),
                block_bytes=_U64.unpack(block_bytes)[0] if block_bytes else 0,
                publishes_in_progress=entries(b"publishes"),
                last_sequence=_U64.unpack(sequence)[0] if sequence else 0,
                map_used_bytes=(info["last_pgno"] + 1) * stat["psize"],
            )

    # Writing.

    def set_blobs_location(self, location: str) -> None:
        """Records where the blocks live, once; later calls must name the same place.

        Args:
            location: The blob store's URL or path, as :func:`hub.blobstore.open_blob_store`
                takes it.

        Raises:
            Conflict: The catalog already records another location.
            CatalogError: The catalog cannot be written.
        """
        with self._write() as txn:
            current = txn.get(_META_BLOBS, db=self._db[b"meta"])
            if current is None:
                txn.put(_META_BLOBS, location.encode("utf-8"), db=self._db[b"meta"])
            elif current.decode("utf-8") != location:
                raise Conflict(
                    f"catalog at {self.path} keeps its blocks in {current.decode('utf-8')}, "
                    f"not {location}"
                )

    def begin_publish(self, block_size: int) -> PublishSession:
        """Starts a staged publish; see :class:`PublishSession`.

        Args:
            block_size: The snapshot's maximum block length, bytes.

        Raises:
            InvalidArgument: ``block_size`` is out of range.
            CatalogError: The catalog cannot be written.
        """
        return PublishSession(self, block_size)

    def add_version(
        self,
        dataset: str,
        block_size: int,
        entries: Iterable[ManifestEntry],
        *,
        tag: str | None = "latest",
        created_ns: int | None = None,
        version: str | None = None,
    ) -> Snapshot:
        """Records a new version of a dataset from a whole manifest (all or nothing).

        The blocks must already be stored. A convenience over :class:`PublishSession`.

        Args:
            dataset: The dataset's name.
            block_size: The snapshot's maximum block length, bytes.
            entries: The manifest, in path order.
            tag: A tag to point at the new version, or None.
            created_ns: Publish time, nanoseconds since the Unix epoch; default now.
            version: Publish as exactly this version (must be the next one); default the
                next one.

        Returns:
            The new version's snapshot.

        Raises:
            InvalidName: ``dataset``, ``tag``, ``version`` or a path is malformed.
            InvalidArgument: ``block_size`` is out of range, or ``version`` is not next.
            VersionExists: ``version`` is already published.
            ValueError: ``entries`` are out of path order or repeat a path.
            CatalogError: The catalog is full or cannot be written.
        """
        validate_dataset(dataset)
        if tag is not None:
            validate_tag(tag)
        session = self.begin_publish(block_size)
        try:
            for entry in entries:
                session.add(entry)
            return session.commit(dataset, tag=tag, created_ns=created_ns, version=version)
        finally:
            session.abort()

    def set_tag(self, dataset: str, tag: str, ref: str) -> Tag:
        """Points a tag at a live version, creating or moving it.

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
            VersionRevoked: ``ref`` names a revoked version.
            CatalogError: The catalog cannot be written.
        """
        validate_dataset(dataset)
        validate_tag(tag)
        validate_ref(ref)
        with self._write() as txn:
            self._require_dataset(txn, dataset)
            number = self._resolve_number(txn, dataset, ref)
            if self._version(txn, dataset, number).revoked:
                raise VersionRevoked(f"{dataset} v{number} was revoked")
            self._put_tag(txn, dataset, tag, number, time.time_ns())
        return Tag(tag, version_name(number))

    def remove_tag(self, dataset: str, tag: str) -> Tag:
        """Removes a tag.

        Args:
            dataset: The dataset's name.
            tag: The tag to remove.

        Returns:
            The tag as it was.

        Raises:
            InvalidName: ``dataset`` or ``tag`` is malformed.
            DatasetNotFound: There is no such dataset.
            RefNotFound: The dataset has no such tag.
            CatalogError: The catalog cannot be written.
        """
        validate_dataset(dataset)
        validate_tag(tag)
        with self._write() as txn:
            self._require_dataset(txn, dataset)
            key = _prefix(dataset) + tag.encode("utf-8")
            value = txn.get(key, db=self._db[b"tags"])
            if value is None:
                raise RefNotFound(f"dataset {dataset!r} has no tag {tag!r}")
            (number,) = _U32.unpack(value)
            txn.delete(key, db=self._db[b"tags"])
            self._append_event(
                txn,
                EventKind.TAG_REMOVED,
                dataset,
                time.time_ns(),
                previous_version=number,
                tag=tag,
            )
        return Tag(tag, version_name(number))

    def revoke(self, dataset: str, version: str) -> Revocation:
        """Revokes a version: it stops resolving and its blocks stop being served.

        In one write transaction: marks the version revoked, removes the tags pointing at
        it, drops its block references (blocks no live version shares become garbage for
        :mod:`hub.gc`) and, when no live version shares the snapshot, its manifest.

        Args:
            dataset: The dataset's name.
            version: The version's name, e.g. ``"v2"``.

        Returns:
            What was done.

        Raises:
            InvalidName: ``dataset`` or ``version`` is malformed.
            DatasetNotFound: There is no such dataset.
            RefNotFound: The dataset has no such version.
            Conflict: The version is already revoked.
            CatalogError: The catalog cannot be written.
        """
        validate_dataset(dataset)
        number = version_number(version)
        now = time.time_ns()
        with self._write() as txn:
            self._require_dataset(txn, dataset)
            snapshot = self._version(txn, dataset, number)
            if snapshot.revoked:
                raise Conflict(f"{dataset} {version} is already revoked")
            txn.put(_version_key(dataset, number), _I64.pack(now), db=self._db[b"revoked"])
            raw_id = bytes.fromhex(snapshot.snapshot_id)
            snapshots = self._db[b"snapshots"]
            record = txn.get(raw_id, db=snapshots)
            if record is None:
                raise CorruptCatalog(f"{dataset} {version}: snapshot record is missing")
            *stats, manifest, live = _SNAPSHOT.unpack(record)
            self._count_blocks(txn, manifest, dataset, -1)
            dropped = live == 1
            if dropped:
                self._drop_manifest(txn, manifest)
                self._add_meta(txn, b"live_snapshots", -1)
                txn.put(raw_id, _SNAPSHOT.pack(*stats, 0, 0), db=snapshots)
            else:
                txn.put(raw_id, _SNAPSHOT.pack(*stats, manifest, live - 1), db=snapshots)
            removed = []
            prefix = _prefix(dataset)
            for key, value in list(_iter_prefix(txn.cursor(db=self._db[b"tags"]), prefix)):
                if _U32.unpack(value)[0] == number:
                    tag = key[len(prefix) :].decode("utf-8")
                    txn.delete(key, db=self._db[b"tags"])
                    self._append_event(
                        txn, EventKind.TAG_REMOVED, dataset, now, previous_version=number, tag=tag
                    )
                    removed.append(tag)
            self._append_event(
                txn,
                EventKind.VERSION_REVOKED,
                dataset,
                now,
                version=number,
                snapshot_id=snapshot.snapshot_id,
            )
            revoked = self._version(txn, dataset, number)
        return Revocation(revoked, tuple(removed), dropped)

    def delete_unreferenced(
        self, digests: Sequence[str], delete: Callable[[list[str]], None]
    ) -> list[str]:
        """Deletes the blocks among ``digests`` that nothing references, under the writer lock.

        The check and ``delete`` run inside one LMDB write transaction, so no publish can
        protect (and then rely on) one of these blocks between the check and the deletion:
        a publish protects a digest in a write transaction before it stores the block.

        Args:
            digests: Candidate digests (e.g. one listing page of the blob store).
            delete: Deletes blobs from the store; called once with the garbage, if any.

        Returns:
            The digests deleted.

        Raises:
            CatalogError: The catalog cannot be locked.
        """
        with self._write() as txn:
            garbage = [digest for digest in digests if not self.is_live_or_pending(txn, digest)]
            if garbage:
                delete(garbage)
            return garbage

    def drop_publish(self, publish_id: int) -> bool:
        """Removes a staged publish: its manifest, its index, its protections, its record.

        Args:
            publish_id: The publish's number.

        Returns:
            True when the publish was still recorded.

        Raises:
            CatalogError: The catalog cannot be written.
        """
        key = _U64.pack(publish_id)
        with self._write() as txn:
            found = txn.delete(key, db=self._db[b"publishes"])
            self._drop_manifest(txn, publish_id)
            cursor = txn.cursor(db=self._db[b"pending"])
            positioned = cursor.first()
            while positioned:
                if cursor.key()[16:] == key:
                    cursor.delete()  # moves to the next record, or unpositions at the end
                    positioned = bool(cursor.key())
                else:
                    positioned = cursor.next()
            return bool(found)

    def prune_events(self, keep: int) -> int:
        """Deletes all but the newest ``keep`` events.

        A watcher that resumes from a pruned sequence gets ``OUT_OF_RANGE`` and re-lists.

        Args:
            keep: Events to keep, at least 0.

        Returns:
            The number of events deleted.

        Raises:
            InvalidArgument: ``keep`` is negative.
            CatalogError: The catalog cannot be written.
        """
        if keep < 0:
            raise InvalidArgument(f"cannot keep {keep} events")
        with self._write() as txn:
            value = txn.get(_META_SEQUENCE, db=self._db[b"meta"])
            last = _U64.unpack(value)[0] if value is not None else 0
            cursor = txn.cursor(db=self._db[b"events"])
            deleted = 0
            if cursor.first():
                while (key := cursor.key()) and _U64.unpack(key)[0] + keep <= last:
                    cursor.delete()
                    deleted += 1
            return deleted

    # Helpers, all inside a caller's transaction.

    def _require_dataset(self, txn: lmdb.Transaction[bytes], dataset: str) -> bytes:
        record = txn.get(dataset.encode("utf-8"), db=self._db[b"datasets"])
        if record is None:
            raise DatasetNotFound(f"unknown dataset {dataset!r}")
        return record

    def _dataset(self, txn: lmdb.Transaction[bytes], name: str) -> Dataset:
        self._require_dataset(txn, name)
        prefix = _prefix(name)
        revoked = self._db[b"revoked"]
        count, latest = 0, 0
        for key, _ in _iter_prefix(txn.cursor(db=self._db[b"versions"]), prefix):
            if txn.get(key, db=revoked) is None:
                count += 1
                (latest,) = _U32.unpack(key[len(prefix) :])
        return Dataset(name, count, version_name(latest) if latest else "")

    def _resolve_number(self, txn: lmdb.Transaction[bytes], dataset: str, ref: str) -> int:
        if is_version(ref):
            return version_number(ref)
        value = txn.get(_prefix(dataset) + ref.encode("utf-8"), db=self._db[b"tags"])
        if value is None:
            raise RefNotFound(f"dataset {dataset!r} has no tag {ref!r}")
        (number,) = _U32.unpack(value)
        return int(number)

    def _version(self, txn: lmdb.Transaction[bytes], dataset: str, number: int) -> Snapshot:
        value = txn.get(_version_key(dataset, number), db=self._db[b"versions"])
        if value is None:
            raise RefNotFound(f"dataset {dataset!r} has no version v{number}")
        return self._snapshot(txn, dataset, number, value)

    def _snapshot(
        self, txn: lmdb.Transaction[bytes], dataset: str, number: int, value: bytes
    ) -> Snapshot:
        try:
            raw_id, created_ns = _VERSION.unpack(value)
            record = txn.get(raw_id, db=self._db[b"snapshots"])
            if record is None:
                raise CorruptCatalog(f"{dataset} v{number}: snapshot {raw_id.hex()} is missing")
            block_size, file_count, total_bytes, entry_count, _, _ = _SNAPSHOT.unpack(record)
            revoked = txn.get(_version_key(dataset, number), db=self._db[b"revoked"])
            revoked_ns = _I64.unpack(revoked)[0] if revoked is not None else 0
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
            revoked_ns=revoked_ns,
        )

    def _manifest_number(self, txn: lmdb.Transaction[bytes], snapshot_id: str) -> int:
        raw_id = bytes.fromhex(validate_digest(snapshot_id))
        record = txn.get(raw_id, db=self._db[b"snapshots"])
        if record is None:
            raise SnapshotNotFound(f"unknown snapshot {snapshot_id}")
        manifest, live = _SNAPSHOT.unpack(record)[4:]
        if not live:
            raise SnapshotNotFound(f"snapshot {snapshot_id} has no live version")
        number: int = manifest
        return number

    def _entry(self, txn: lmdb.Transaction[bytes], manifest: int, index: bytes) -> ManifestEntry:
        value = txn.get(_U64.pack(manifest) + index, db=self._db[b"manifests"])
        if value is None:
            raise CorruptCatalog(f"manifest {manifest} lacks an indexed entry")
        return decode_entry(value)

    def _put_tag(
        self, txn: lmdb.Transaction[bytes], dataset: str, tag: str, number: int, now: int
    ) -> None:
        key = _prefix(dataset) + tag.encode("utf-8")
        old = txn.get(key, db=self._db[b"tags"])
        previous = _U32.unpack(old)[0] if old is not None else 0
        if previous == number:
            return
        txn.put(key, _U32.pack(number), db=self._db[b"tags"])
        self._append_event(
            txn,
            EventKind.TAG_MOVED,
            dataset,
            now,
            version=number,
            previous_version=previous,
            tag=tag,
        )

    def _append_event(
        self,
        txn: lmdb.Transaction[bytes],
        kind: EventKind,
        dataset: str,
        time_ns: int,
        **fields: int | str,
    ) -> int:
        sequence = self._add_meta(txn, _META_SEQUENCE, 1)
        event = Event(sequence, kind, dataset, time_ns, **fields)  # type: ignore[arg-type]
        txn.put(_U64.pack(sequence), encode_event(event), db=self._db[b"events"])
        return sequence

    def _add_meta(self, txn: lmdb.Transaction[bytes], key: bytes, delta: int) -> int:
        meta = self._db[b"meta"]
        value = txn.get(key, db=meta)
        count = (_U64.unpack(value)[0] if value is not None else 0) + delta
        txn.put(key, _U64.pack(count), db=meta)
        return count

    def _count_blocks(
        self,
        txn: lmdb.Transaction[bytes],
        manifest: int,
        dataset: str,
        delta: int,
        unprotect: int | None = None,
    ) -> None:
        """Adds ``delta`` to the references of every block occurrence in a manifest.

        With ``unprotect``, also removes that publish's protection of each block.
        """
        blocks, refs, pending = self._db[b"blocks"], self._db[b"block_refs"], self._db[b"pending"]
        suffix = _U64.pack(unprotect) if unprotect is not None else None
        name = dataset.encode("utf-8")
        byte_delta = 0
        prefix = _U64.pack(manifest)
        for _, value in _iter_prefix(txn.cursor(db=self._db[b"manifests"]), prefix):
            for raw, size in decode_block_refs(value):
                record = txn.get(raw, db=blocks)
                count = (_BLOCK.unpack(record)[0] if record is not None else 0) + delta
                if count < 0:
                    raise CorruptCatalog(f"reference count of block {raw.hex()} below zero")
                if count == 0:
                    txn.delete(raw, db=blocks)
                    byte_delta -= size
                else:
                    if record is None:
                        byte_delta += size
                    txn.put(raw, _BLOCK.pack(count, size), db=blocks)
                _add_count(txn, refs, raw + name, delta)
                if suffix is not None:
                    txn.delete(raw + suffix, db=pending)
        if byte_delta:
            self._add_meta(txn, b"block_bytes", byte_delta)

    def _drop_manifest(self, txn: lmdb.Transaction[bytes], manifest: int) -> None:
        prefix = _U64.pack(manifest)
        _delete_prefix(txn.cursor(db=self._db[b"manifests"]), prefix)
        _delete_prefix(txn.cursor(db=self._db[b"dirs"]), prefix)


class PublishSession:
    """A staged publish: add entries in path order, protect blocks, then commit or abort.

    Entries are written to the catalog in batches of :data:`STAGE_ENTRIES`, under a
    manifest number no snapshot points at yet (so memory stays bounded and readers never
    see a partial manifest). :meth:`protect` must cover every block before the block is
    stored. :meth:`abort` (also safe after a commit, where it does nothing) removes what
    was staged.

    Args:
        catalog: The catalog to publish into.
        block_size: The snapshot's maximum block length, bytes.

    Raises:
        InvalidArgument: ``block_size`` is out of range.
        CatalogError: The catalog cannot be written.
    """

    def __init__(self, catalog: Catalog, block_size: int) -> None:
        self._catalog = catalog
        self._hasher = ManifestHasher(block_size)
        self.block_size = block_size
        self.started_ns = time.time_ns()
        self._entries: list[tuple[str, bytes]] = []
        self._count = 0
        self._files = 0
        self._bytes = 0
        self._done = False
        db = catalog._db
        with catalog._write() as txn:
            self.publish_id = catalog._add_meta(txn, _META_MANIFEST, 1)
            host = socket.gethostname().encode("utf-8")
            txn.put(
                _U64.pack(self.publish_id),
                _PUBLISH.pack(self.started_ns, os.getpid()) + host,
                db=db[b"publishes"],
            )

    @property
    def entry_count(self) -> int:
        """Entries added so far."""
        return self._count

    def add(self, entry: ManifestEntry) -> None:
        """Adds the next manifest entry (in path order).

        Raises:
            ValueError: The entry is out of path order or repeats a path.
            CatalogError: A staging write failed.
        """
        encoded = self._hasher.add(entry)
        self._entries.append((entry.path, encoded))
        self._count += 1
        if entry.type == EntryType.FILE:
            self._files += 1
            self._bytes += entry.size
        if len(self._entries) >= STAGE_ENTRIES:
            self.protect(())

    def protect(self, digests: Iterable[str]) -> None:
        """Keeps blocks safe from garbage collection until commit or abort.

        Call before storing the blocks (even ones the store already holds). Also writes
        the entries buffered so far, in the same transaction.

        Args:
            digests: The blocks' digests.

        Raises:
            CatalogError: The catalog cannot be written, or garbage collection dropped
                this publish as abandoned.
        """
        catalog = self._catalog
        db = catalog._db
        suffix = _U64.pack(self.publish_id)
        first = self._count - len(self._entries)
        with catalog._write() as txn:
            if txn.get(suffix, db=db[b"publishes"]) is None:
                raise CatalogError(f"publish {self.publish_id} was dropped as abandoned")
            for digest in digests:
                txn.put(bytes.fromhex(digest) + suffix, b"", db=db[b"pending"])
            for offset, (path, encoded) in enumerate(self._entries):
                index = _U64.pack(first + offset)
                txn.put(suffix + index, encoded, db=db[b"manifests"])
                txn.put(_dir_key(self.publish_id, path), index, db=db[b"dirs"])
        self._entries.clear()

    def commit(
        self,
        dataset: str,
        *,
        tag: str | None = "latest",
        created_ns: int | None = None,
        version: str | None = None,
    ) -> Snapshot:
        """Creates the version, in one write transaction.

        Args:
            dataset: The dataset's name; created by its first version.
            tag: A tag to point at the new version, or None.
            created_ns: Publish time, nanoseconds since the Unix epoch; default now.
            version: Publish as exactly this version (must be the next one); default the
                next one.

        Returns:
            The new version's snapshot.

        Raises:
            InvalidName: ``dataset``, ``tag`` or ``version`` is malformed.
            InvalidArgument: ``version`` is not the dataset's next version.
            VersionExists: ``version`` is already published (versions never change).
            CatalogError: The catalog cannot be written.
        """
        validate_dataset(dataset)
        if tag is not None:
            validate_tag(tag)
        wanted = version_number(version) if version is not None else None
        self.protect(())
        catalog, db = self._catalog, self._catalog._db
        sid = self._hasher.hexdigest()
        raw_id = bytes.fromhex(sid)
        now = time.time_ns()
        created = now if created_ns is None else created_ns
        with catalog._write() as txn:
            if not txn.delete(_U64.pack(self.publish_id), db=db[b"publishes"]):
                raise CatalogError(f"publish {self.publish_id} was dropped as abandoned")
            record = txn.get(dataset.encode("utf-8"), db=db[b"datasets"])
            last, dataset_created = _DATASET.unpack(record) if record else (0, created)
            number = last + 1
            if wanted is not None and wanted != number:
                if wanted <= last:
                    raise VersionExists(
                        f"{dataset} v{wanted} is already published; versions never change"
                    )
                raise InvalidArgument(f"{dataset}: the next version is v{number}, not v{wanted}")
            version_name(number)  # range check
            existing = txn.get(raw_id, db=db[b"snapshots"])
            if existing is not None and _SNAPSHOT.unpack(existing)[5] > 0:
                manifest, live = _SNAPSHOT.unpack(existing)[4:]
                catalog._drop_manifest(txn, self.publish_id)
            else:
                manifest, live = self.publish_id, 0
                catalog._add_meta(txn, b"live_snapshots", 1)
            txn.put(
                raw_id,
                _SNAPSHOT.pack(
                    self.block_size, self._files, self._bytes, self._count, manifest, live + 1
                ),
                db=db[b"snapshots"],
            )
            catalog._count_blocks(txn, manifest, dataset, +1, unprotect=self.publish_id)
            if not txn.put(
                _version_key(dataset, number),
                _VERSION.pack(raw_id, created),
                db=db[b"versions"],
                overwrite=False,
            ):
                raise CorruptCatalog(f"dataset {dataset!r} already has v{number}")
            txn.put(
                dataset.encode("utf-8"), _DATASET.pack(number, dataset_created), db=db[b"datasets"]
            )
            catalog._append_event(
                txn,
                EventKind.VERSION_PUBLISHED,
                dataset,
                now,
                version=number,
                snapshot_id=sid,
                duration_ns=max(0, now - self.started_ns),
            )
            if tag is not None:
                catalog._put_tag(txn, dataset, tag, number, now)
            snapshot = catalog._snapshot(txn, dataset, number, _VERSION.pack(raw_id, created))
        self._done = True
        return snapshot

    def abort(self) -> None:
        """Removes everything staged unless the publish committed; never raises."""
        if self._done:
            return
        self._done = True
        try:
            self._catalog.drop_publish(self.publish_id)
        except Exception:  # the publish already failed; gc removes what is left
            logger.warning(
                "could not remove staged publish %d; gc will", self.publish_id, exc_info=True
            )
