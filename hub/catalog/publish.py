"""Publishing: staging a manifest in small transactions, protecting blocks, committing.

A :class:`PublishSession` writes through the catalog's public transactions
(:meth:`hub.catalog.base.CatalogBase.write`) and the record operations of
:class:`~hub.catalog.txn.CatalogTxn`; see :mod:`hub.catalog` for the protocol.
:class:`PublishesMixin` gives :class:`hub.catalog.Catalog` the staged publishes' records.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from hub.catalog.base import CatalogBase
from hub.catalog.events import EventKind
from hub.catalog.records import PublishRecord, Snapshot
from hub.catalog.refs import count_blocks
from hub.catalog.schema import (
    DATASET,
    META_LIVE_SNAPSHOTS,
    META_MANIFEST,
    PUBLISH,
    SNAPSHOT,
    STAGE_ENTRIES,
    U64,
    VERSION,
    dir_key,
    version_key,
)
from hub.errors import CatalogError, CorruptCatalog, InvalidArgument, VersionExists
from hub.snapshot.manifest import (
    MAX_PATH_BYTES,
    EntryType,
    ManifestEntry,
    ManifestHasher,
    decode_entry,
)
from hub.snapshot.names import validate_dataset, validate_tag, version_name, version_number

if TYPE_CHECKING:
    from hub.auth.signing import Signer

logger = logging.getLogger("hub.catalog")


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

    def __init__(self, catalog: PublishesMixin, block_size: int) -> None:
        self._catalog = catalog
        self._hasher = ManifestHasher(block_size)
        self.block_size = block_size
        self.started_ns = time.time_ns()
        self._entries: list[tuple[str, bytes]] = []
        self._count = 0
        self._files = 0
        self._bytes = 0
        self._done = False
        with catalog.write() as txn:
            self.publish_id = txn.add_meta(META_MANIFEST, 1)
            host = socket.gethostname().encode("utf-8")
            txn.put(
                U64.pack(self.publish_id),
                PUBLISH.pack(self.started_ns, os.getpid()) + host,
                db=txn.db[b"publishes"],
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
        suffix = U64.pack(self.publish_id)
        first = self._count - len(self._entries)
        with self._catalog.write() as txn:
            db = txn.db
            if txn.get(suffix, db=db[b"publishes"]) is None:
                raise CatalogError(f"publish {self.publish_id} was dropped as abandoned")
            for digest in digests:
                txn.put(bytes.fromhex(digest) + suffix, b"", db=db[b"pending"])
            for offset, (path, encoded) in enumerate(self._entries):
                index = U64.pack(first + offset)
                txn.put(suffix + index, encoded, db=db[b"manifests"])
                txn.put(dir_key(self.publish_id, path), index, db=db[b"dirs"])
        self._entries.clear()

    def staged(self, path: str) -> ManifestEntry | None:
        """The entry added at ``path`` so far, or None (writes the buffered entries first).

        Raises:
            CatalogError: The catalog cannot be read or written.
        """
        if self._entries:
            self.protect(())
        if len(path.encode("utf-8")) > MAX_PATH_BYTES:
            return None  # no entry has such a path (and LMDB keys are shorter)
        with self._catalog.read() as txn:
            index = txn.get(dir_key(self.publish_id, path), db=txn.db[b"dirs"])
            return None if index is None else txn.entry(self.publish_id, index)

    def staged_symlinks(self, page_entries: int = STAGE_ENTRIES) -> Iterator[ManifestEntry]:
        """The symlinks added so far, in path order, one read transaction per page of
        ``page_entries`` entries (only symlinks are decoded; writes the buffered entries
        first).

        Raises:
            CatalogError: The catalog cannot be read or written.
        """
        if self._entries:
            self.protect(())
        prefix = U64.pack(self.publish_id)
        start = 0
        while start < self._count:
            found: list[bytes] = []
            with self._catalog.read() as txn:
                cursor = txn.cursor(db=txn.db[b"manifests"])
                if not cursor.set_range(prefix + U64.pack(start)):
                    return
                read = 0
                for key, value in cursor:
                    if not key.startswith(prefix) or read >= page_entries:
                        break
                    read += 1
                    if value[0] == EntryType.SYMLINK:  # an entry's first byte is its type
                        found.append(bytes(value))
            if read == 0:
                return
            start += read
            yield from (decode_entry(value) for value in found)

    def commit(
        self,
        dataset: str,
        *,
        tag: str | None = "latest",
        created_ns: int | None = None,
        version: str | None = None,
        signer: Signer | None = None,
    ) -> Snapshot:
        """Creates the version, in one write transaction.

        Args:
            dataset: The dataset's name; created by its first version.
            tag: A tag to point at the new version, or None.
            created_ns: Publish time, nanoseconds since the Unix epoch; default now.
            version: Publish as exactly this version (must be the next one); default the
                next one.
            signer: Signs the new version (:mod:`hub.auth.signing`); its signature is stored
                with the version and served in every ``Snapshot``. None: unsigned.

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
        sid = self._hasher.hexdigest()
        raw_id = bytes.fromhex(sid)
        now = time.time_ns()
        created = now if created_ns is None else created_ns
        with self._catalog.write() as txn:
            db = txn.db
            if not txn.delete(U64.pack(self.publish_id), db=db[b"publishes"]):
                raise CatalogError(f"publish {self.publish_id} was dropped as abandoned")
            record = txn.get(dataset.encode("utf-8"), db=db[b"datasets"])
            last, dataset_created = DATASET.unpack(record) if record else (0, created)
            number = last + 1
            if wanted is not None and wanted != number:
                if wanted <= last:
                    raise VersionExists(
                        f"{dataset} v{wanted} is already published; versions never change"
                    )
                raise InvalidArgument(f"{dataset}: the next version is v{number}, not v{wanted}")
            version_name(number)  # range check
            existing = txn.get(raw_id, db=db[b"snapshots"])
            if existing is not None and SNAPSHOT.unpack(existing)[5] > 0:
                manifest, live = SNAPSHOT.unpack(existing)[4:]
                txn.drop_manifest(self.publish_id)
            else:
                manifest, live = self.publish_id, 0
                txn.add_meta(META_LIVE_SNAPSHOTS, 1)
            txn.put(
                raw_id,
                SNAPSHOT.pack(
                    self.block_size, self._files, self._bytes, self._count, manifest, live + 1
                ),
                db=db[b"snapshots"],
            )
            count_blocks(txn, manifest, dataset, +1, unprotect=self.publish_id)
            if not txn.put(
                version_key(dataset, number),
                VERSION.pack(raw_id, created),
                db=db[b"versions"],
                overwrite=False,
            ):
                raise CorruptCatalog(f"dataset {dataset!r} already has v{number}")
            if signer is not None:
                signature = signer(dataset, version_name(number), sid)
                txn.put(version_key(dataset, number), signature, db=db[b"signatures"])
            txn.put(
                dataset.encode("utf-8"), DATASET.pack(number, dataset_created), db=db[b"datasets"]
            )
            txn.append_event(
                EventKind.VERSION_PUBLISHED,
                dataset,
                now,
                version=number,
                snapshot_id=sid,
                duration_ns=max(0, now - self.started_ns),
            )
            if tag is not None:
                txn.put_tag(dataset, tag, number, now)
            snapshot = txn.snapshot(dataset, number, VERSION.pack(raw_id, created))
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


class PublishesMixin(CatalogBase):
    """Staged publishes: begun, listed while in progress or abandoned, and dropped."""

    def list_publishes(self) -> list[PublishRecord]:
        """Lists publishes staged but not committed: in progress, or abandoned by a crash."""
        with self.read() as txn:
            records = []
            for key, value in txn.cursor(db=self._db[b"publishes"]):
                started_ns, pid = PUBLISH.unpack_from(value)
                host = value[PUBLISH.size :].decode("utf-8")
                records.append(PublishRecord(U64.unpack(key)[0], started_ns, pid, host))
            return records

    def begin_publish(self, block_size: int) -> PublishSession:
        """Starts a staged publish; see :class:`PublishSession`.

        Args:
            block_size: The snapshot's maximum block length, bytes.

        Raises:
            InvalidArgument: ``block_size`` is out of range.
            CatalogError: The catalog cannot be written.
        """
        return PublishSession(self, block_size)

    def drop_publish(self, publish_id: int) -> bool:
        """Removes a staged publish: its manifest, its index, its protections, its record.

        Args:
            publish_id: The publish's number.

        Returns:
            True when the publish was still recorded.

        Raises:
            CatalogError: The catalog cannot be written.
        """
        key = U64.pack(publish_id)
        with self.write() as txn:
            found = txn.delete(key, db=self._db[b"publishes"])
            txn.drop_manifest(publish_id)
            cursor = txn.cursor(db=self._db[b"pending"])
            positioned = cursor.first()
            while positioned:
                if cursor.key()[16:] == key:
                    cursor.delete()  # moves to the next record, or unpositions at the end
                    positioned = bool(cursor.key())
                else:
                    positioned = cursor.next()
            return bool(found)
