"""The :class:`Catalog`: datasets, versions, tags, revocation, the blob store, statistics."""

from __future__ import annotations

import time

from hub.catalog.base import CatalogBase
from hub.catalog.eventlog import EventsMixin
from hub.catalog.events import EventKind
from hub.catalog.manifests import ManifestsMixin
from hub.catalog.publish import PublishesMixin
from hub.catalog.records import CatalogStats, Dataset, Revocation, Snapshot, Tag
from hub.catalog.refs import RefsMixin, count_blocks
from hub.catalog.schema import (
    I64,
    META_BLOBS,
    META_BLOCK_BYTES,
    META_GRANT_KEY,
    META_LIVE_SNAPSHOTS,
    META_MIGRATED,
    META_SEQUENCE,
    SNAPSHOT,
    U32,
    U64,
    dataset_prefix,
    iter_prefix,
    version_key,
)
from hub.errors import Conflict, CorruptCatalog, RefNotFound, VersionRevoked
from hub.snapshot.names import (
    validate_dataset,
    validate_ref,
    validate_tag,
    version_name,
    version_number,
)


class Catalog(ManifestsMixin, RefsMixin, EventsMixin, PublishesMixin, CatalogBase):
    """The hub's catalog in an LMDB environment (``DATA_DIR/catalog``).

    Safe to use from several threads; every method runs its own transaction. Use as a
    context manager or call :meth:`close`. The methods are grouped by module: manifests
    (:mod:`hub.catalog.manifests`), block references (:mod:`hub.catalog.refs`), events
    (:mod:`hub.catalog.eventlog`), staged publishes (:mod:`hub.catalog.publish`) and, here,
    datasets, versions, tags and revocation.

    Args:
        path: The environment directory.
        create: Create the environment when missing; when False a missing catalog raises.
        map_size: LMDB map size, bytes; the upper bound of the catalog's size.

    Raises:
        CatalogError: The catalog does not exist (``create`` False), cannot be opened, or
            was written in another format.
    """

    # Reading.

    def list_datasets(self) -> list[Dataset]:
        """Lists every dataset, in name order.

        Returns:
            One :class:`Dataset` per dataset.
        """
        with self.read() as txn:
            names = [key.decode("utf-8") for key, _ in txn.cursor(db=self._db[b"datasets"])]
            return [txn.dataset(name) for name in names]

    def dataset(self, name: str) -> Dataset:
        """Describes one dataset.

        Raises:
            InvalidName: ``name`` is malformed.
            DatasetNotFound: There is no such dataset.
        """
        validate_dataset(name)
        with self.read() as txn:
            return txn.dataset(name)

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
        with self.read() as txn:
            txn.require_dataset(dataset)
            prefix = dataset_prefix(dataset)
            snapshots = []
            for key, value in iter_prefix(txn.cursor(db=self._db[b"versions"]), prefix):
                (number,) = U32.unpack(key[len(prefix) :])
                snapshot = txn.snapshot(dataset, number, value)
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
        with self.read() as txn:
            txn.require_dataset(dataset)
            prefix = dataset_prefix(dataset)
            return [
                Tag(key[len(prefix) :].decode("utf-8"), version_name(U32.unpack(value)[0]))
                for key, value in iter_prefix(txn.cursor(db=self._db[b"tags"]), prefix)
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
        with self.read() as txn:
            txn.require_dataset(dataset)
            snapshot = txn.version(dataset, txn.resolve_number(dataset, ref))
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
        with self.read() as txn:
            txn.require_dataset(dataset)
            return txn.version(dataset, number)

    def blobs_location(self) -> str | None:
        """The blob store this catalog's blocks live in, as recorded by the first publish."""
        with self.read() as txn:
            value = txn.get(META_BLOBS, db=self._db[b"meta"])
            return value.decode("utf-8") if value is not None else None

    def migrated_to(self) -> str | None:
        """The shared catalog this one was moved to by ``strata-hub migrate``, or None."""
        with self.read() as txn:
            value = txn.get(META_MIGRATED, db=self._db[b"meta"])
            return value.decode("utf-8") if value is not None else None

    def mark_migrated(self, location: str) -> None:
        """Records that this catalog was moved to ``location`` (a redacted URL); see
        :meth:`hub.store.datadir.DataDir.open_catalog`."""
        with self.write() as txn:
            txn.put(META_MIGRATED, location.encode("utf-8"), db=self._db[b"meta"])

    def stats(self) -> CatalogStats:
        """Counts the catalog's records (O(1) per database on LMDB, from its own statistics;
        a count per database on PostgreSQL)."""
        with self.read() as txn:

            def entries(name: bytes) -> int:
                return txn.entries(self._db[name])

            meta = self._db[b"meta"]
            sequence = txn.get(META_SEQUENCE, db=meta)
            block_bytes = txn.get(META_BLOCK_BYTES, db=meta)
            live_snapshots = txn.get(META_LIVE_SNAPSHOTS, db=meta)
            return CatalogStats(
                datasets=entries(b"datasets"),
                versions=entries(b"versions"),
                revoked_versions=entries(b"revoked"),
                tags=entries(b"tags"),
                snapshots=U64.unpack(live_snapshots)[0] if live_snapshots else 0,
                blocks=entries(b"blocks"),
                block_bytes=U64.unpack(block_bytes)[0] if block_bytes else 0,
                publishes_in_progress=entries(b"publishes"),
                last_sequence=U64.unpack(sequence)[0] if sequence else 0,
                map_used_bytes=self.engine.used_bytes(),
            )

    # Writing.

    def set_blobs_location(self, location: str) -> None:
        """Records where the blocks live, once; later calls must name the same place.

        Args:
            location: The blob store's URL or path, as :func:`hub.store.blobstore.open_blob_store`
                takes it.

        Raises:
            Conflict: The catalog already records another location.
            CatalogError: The catalog cannot be written.
        """
        with self.write() as txn:
            current = txn.get(META_BLOBS, db=self._db[b"meta"])
            if current is None:
                txn.put(META_BLOBS, location.encode("utf-8"), db=self._db[b"meta"])
            elif current.decode("utf-8") != location:
                raise Conflict(
                    f"catalog at {self.location} keeps its blocks in {current.decode('utf-8')}, "
                    f"not {location}"
                )

    def set_grant_key(self, key_id: str, replace: bool = False) -> None:
        """Records the key id read grants are signed with, once; a later call must name the
        same key unless ``replace`` (a rotation: every replica must then be given the new
        key, and those still holding the old one refuse to start).

        Args:
            key_id: The grant key's id (public: ``protocol.grants.key_id``).
            replace: Record ``key_id`` whatever is recorded.

        Raises:
            Conflict: Another key is recorded.
            CatalogError: The catalog cannot be written.
        """
        with self.write() as txn:
            current = txn.get(META_GRANT_KEY, db=self._db[b"meta"])
            if current is None or replace:
                txn.put(META_GRANT_KEY, key_id.encode("ascii"), db=self._db[b"meta"])
            elif current.decode("ascii") != key_id:
                raise Conflict(
                    f"the replicas of catalog {self.location} sign read grants with key "
                    f"{current.decode('ascii')}, and this one's --grant-key is {key_id}: spokes "
                    "would refuse some grants. Give every replica the same key file, or, to "
                    "rotate the key, start with --rotate-grant-key and then restart every "
                    "replica with the new key"
                )

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
        with self.write() as txn:
            txn.require_dataset(dataset)
            number = txn.resolve_number(dataset, ref)
            if txn.version(dataset, number).revoked:
                raise VersionRevoked(f"{dataset} v{number} was revoked")
            txn.put_tag(dataset, tag, number, time.time_ns())
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
        with self.write() as txn:
            txn.require_dataset(dataset)
            key = dataset_prefix(dataset) + tag.encode("utf-8")
            value = txn.get(key, db=self._db[b"tags"])
            if value is None:
                raise RefNotFound(f"dataset {dataset!r} has no tag {tag!r}")
            (number,) = U32.unpack(value)
            txn.delete(key, db=self._db[b"tags"])
            txn.append_event(
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
        :mod:`hub.store.gc`) and, when no live version shares the snapshot, its manifest.

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
        with self.write() as txn:
            txn.require_dataset(dataset)
            snapshot = txn.version(dataset, number)
            if snapshot.revoked:
                raise Conflict(f"{dataset} {version} is already revoked")
            txn.put(version_key(dataset, number), I64.pack(now), db=self._db[b"revoked"])
            raw_id = bytes.fromhex(snapshot.snapshot_id)
            snapshots = self._db[b"snapshots"]
            record = txn.get(raw_id, db=snapshots)
            if record is None:
                raise CorruptCatalog(f"{dataset} {version}: snapshot record is missing")
            *stats, manifest, live = SNAPSHOT.unpack(record)
            count_blocks(txn, manifest, dataset, -1)
            dropped = live == 1
            if dropped:
                txn.drop_manifest(manifest)
                txn.add_meta(META_LIVE_SNAPSHOTS, -1)
                txn.put(raw_id, SNAPSHOT.pack(*stats, 0, 0), db=snapshots)
            else:
                txn.put(raw_id, SNAPSHOT.pack(*stats, manifest, live - 1), db=snapshots)
            removed = []
            prefix = dataset_prefix(dataset)
            for key, value in list(iter_prefix(txn.cursor(db=self._db[b"tags"]), prefix)):
                if U32.unpack(value)[0] == number:
                    tag = key[len(prefix) :].decode("utf-8")
                    txn.delete(key, db=self._db[b"tags"])
                    txn.append_event(
                        EventKind.TAG_REMOVED, dataset, now, previous_version=number, tag=tag
                    )
                    removed.append(tag)
            txn.append_event(
                EventKind.VERSION_REVOKED,
                dataset,
                now,
                version=number,
                snapshot_id=snapshot.snapshot_id,
            )
            revoked = txn.version(dataset, number)
        return Revocation(revoked, tuple(removed), dropped)
