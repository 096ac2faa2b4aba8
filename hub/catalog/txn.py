"""One catalog transaction and the record operations done inside it.

:class:`CatalogTxn` wraps an LMDB transaction with the catalog's named databases. The
catalog's own methods and :class:`~hub.catalog.publish.PublishSession` use it through
its public surface (``Catalog.read()`` / ``Catalog.write()``): looking up datasets,
versions and snapshots, moving tags, appending events, counting meta records, dropping
a manifest. Nothing here opens or commits a transaction; that is the caller's ``with``.
"""

from __future__ import annotations

import struct

import lmdb

from hub.catalog.events import Event, EventKind, encode_event
from hub.catalog.records import Dataset, Snapshot
from hub.catalog.schema import (
    I64,
    META_SEQUENCE,
    SNAPSHOT,
    U32,
    U64,
    VERSION,
    dataset_prefix,
    delete_prefix,
    iter_prefix,
    version_key,
)
from hub.errors import CorruptCatalog, DatasetNotFound, RefNotFound, SnapshotNotFound
from hub.snapshot.manifest import ManifestEntry, decode_entry
from hub.snapshot.names import is_version, validate_digest, version_name, version_number


class CatalogTxn:
    """A read or write transaction on a catalog.

    The LMDB calls (:meth:`get`, :meth:`put`, :meth:`delete`, :meth:`cursor`,
    :meth:`entries`) take the database as LMDB does (``db=txn.db[b"tags"]``); the other
    methods work on whole records. Writing methods need a write transaction.

    Args:
        txn: The open LMDB transaction.
        dbs: The catalog's named databases (see :data:`hub.catalog.schema.DB_NAMES`).
    """

    def __init__(self, txn: lmdb.Transaction[bytes], dbs: dict[bytes, lmdb._Database]) -> None:
        self.txn = txn
        self.db = dbs

    # LMDB, as is.

    def get(self, key: bytes, *, db: lmdb._Database) -> bytes | None:
        """The value at ``key`` in ``db``, or None."""
        return self.txn.get(key, db=db)

    def put(self, key: bytes, value: bytes, *, db: lmdb._Database, overwrite: bool = True) -> bool:
        """Stores ``value`` at ``key``; False when ``overwrite`` is off and the key exists."""
        return bool(self.txn.put(key, value, db=db, overwrite=overwrite))

    def delete(self, key: bytes, *, db: lmdb._Database) -> bool:
        """Deletes ``key``; False when it was absent."""
        return bool(self.txn.delete(key, db=db))

    def cursor(self, *, db: lmdb._Database) -> lmdb.Cursor[bytes]:
        """A cursor over ``db``."""
        return self.txn.cursor(db=db)

    def entries(self, db: lmdb._Database) -> int:
        """Records in ``db`` (from LMDB's statistics: O(1))."""
        return int(self.txn.stat(db)["entries"])

    # Records.

    def require_dataset(self, dataset: str) -> bytes:
        """The dataset's record.

        Raises:
            DatasetNotFound: There is no such dataset.
        """
        record = self.get(dataset.encode("utf-8"), db=self.db[b"datasets"])
        if record is None:
            raise DatasetNotFound(f"unknown dataset {dataset!r}")
        return record

    def dataset(self, name: str) -> Dataset:
        """The dataset with its live version count and latest live version.

        Raises:
            DatasetNotFound: There is no such dataset.
        """
        self.require_dataset(name)
        prefix = dataset_prefix(name)
        revoked = self.db[b"revoked"]
        count, latest = 0, 0
        for key, _ in iter_prefix(self.cursor(db=self.db[b"versions"]), prefix):
            if self.get(key, db=revoked) is None:
                count += 1
                (latest,) = U32.unpack(key[len(prefix) :])
        return Dataset(name, count, version_name(latest) if latest else "")

    def resolve_number(self, dataset: str, ref: str) -> int:
        """The version number ``ref`` (a version or a tag) names.

        Raises:
            RefNotFound: ``ref`` is a tag the dataset does not have.
        """
        if is_version(ref):
            return version_number(ref)
        value = self.get(dataset_prefix(dataset) + ref.encode("utf-8"), db=self.db[b"tags"])
        if value is None:
            raise RefNotFound(f"dataset {dataset!r} has no tag {ref!r}")
        (number,) = U32.unpack(value)
        return int(number)

    def version(self, dataset: str, number: int) -> Snapshot:
        """Version ``number`` of ``dataset``, revoked or not.

        Raises:
            RefNotFound: The dataset has no such version.
            CorruptCatalog: Its records are damaged.
        """
        value = self.get(version_key(dataset, number), db=self.db[b"versions"])
        if value is None:
            raise RefNotFound(f"dataset {dataset!r} has no version v{number}")
        return self.snapshot(dataset, number, value)

    def snapshot(self, dataset: str, number: int, value: bytes) -> Snapshot:
        """The :class:`Snapshot` of version ``number`` from its ``versions`` record ``value``.

        Raises:
            CorruptCatalog: The snapshot record is missing or a record is damaged.
        """
        try:
            raw_id, created_ns = VERSION.unpack(value)
            record = self.get(raw_id, db=self.db[b"snapshots"])
            if record is None:
                raise CorruptCatalog(f"{dataset} v{number}: snapshot {raw_id.hex()} is missing")
            block_size, file_count, total_bytes, entry_count, _, _ = SNAPSHOT.unpack(record)
            revoked = self.get(version_key(dataset, number), db=self.db[b"revoked"])
            revoked_ns = I64.unpack(revoked)[0] if revoked is not None else 0
            signature = self.get(version_key(dataset, number), db=self.db[b"signatures"])
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
            signature=bytes(signature or b""),
        )

    def manifest_number(self, snapshot_id: str) -> int:
        """The number the live snapshot's manifest is stored under.

        Raises:
            InvalidDigest: ``snapshot_id`` is malformed.
            SnapshotNotFound: No live manifest is stored under ``snapshot_id``.
        """
        raw_id = bytes.fromhex(validate_digest(snapshot_id))
        record = self.get(raw_id, db=self.db[b"snapshots"])
        if record is None:
            raise SnapshotNotFound(f"unknown snapshot {snapshot_id}")
        manifest, live = SNAPSHOT.unpack(record)[4:]
        if not live:
            raise SnapshotNotFound(f"snapshot {snapshot_id} has no live version")
        number: int = manifest
        return number

    def entry(self, manifest: int, index: bytes) -> ManifestEntry:
        """Entry ``index`` (u64 bytes) of a manifest, decoded.

        Raises:
            CorruptCatalog: The entry is missing or cannot be decoded.
        """
        value = self.get(U64.pack(manifest) + index, db=self.db[b"manifests"])
        if value is None:
            raise CorruptCatalog(f"manifest {manifest} lacks an indexed entry")
        return decode_entry(value)

    def put_tag(self, dataset: str, tag: str, number: int, now: int) -> None:
        """Points ``tag`` at version ``number``, with a ``TAG_MOVED`` event (none if unmoved)."""
        key = dataset_prefix(dataset) + tag.encode("utf-8")
        old = self.get(key, db=self.db[b"tags"])
        previous = U32.unpack(old)[0] if old is not None else 0
        if previous == number:
            return
        self.put(key, U32.pack(number), db=self.db[b"tags"])
        self.append_event(
            EventKind.TAG_MOVED,
            dataset,
            now,
            version=number,
            previous_version=previous,
            tag=tag,
        )

    def append_event(self, kind: EventKind, dataset: str, time_ns: int, **fields: int | str) -> int:
        """Appends an event under ``last_sequence + 1``; returns its sequence number."""
        sequence = self.add_meta(META_SEQUENCE, 1)
        event = Event(sequence, kind, dataset, time_ns, **fields)  # type: ignore[arg-type]
        self.put(U64.pack(sequence), encode_event(event), db=self.db[b"events"])
        return sequence

    def add_meta(self, key: bytes, delta: int) -> int:
        """Adds ``delta`` to the u64 ``meta`` counter ``key``; returns the new value."""
        meta = self.db[b"meta"]
        value = self.get(key, db=meta)
        count = (U64.unpack(value)[0] if value is not None else 0) + delta
        self.put(key, U64.pack(count), db=meta)
        return count

    def drop_manifest(self, manifest: int) -> None:
        """Deletes a manifest's entries and its directory index."""
        prefix = U64.pack(manifest)
        delete_prefix(self.cursor(db=self.db[b"manifests"]), prefix)
        delete_prefix(self.cursor(db=self.db[b"dirs"]), prefix)
