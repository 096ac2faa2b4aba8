"""Reading manifests: pages in path order, directories through the ``dirs`` index, and
re-hashing a stored manifest against its snapshot id."""

from __future__ import annotations

from collections.abc import Iterator

from hub.catalog.base import CatalogBase
from hub.catalog.schema import (
    MANIFEST_PAGE_ENTRIES,
    SNAPSHOT,
    U64,
    dir_hash,
    dir_key,
    split_path,
)
from hub.errors import CorruptCatalog, NotADirectory, PathNotFound, SnapshotNotFound
from hub.snapshot.manifest import (
    EntryType,
    ManifestEntry,
    ManifestHasher,
    decode_entry,
    validate_path,
)
from hub.snapshot.names import validate_digest

BLOCK_WIRE_BYTES = 42
"""About what one block costs in a ``ManifestEntry`` message: a ``BlockRef`` of a
32-character hex digest and a size, framed."""


def entry_wire_bytes(entry: ManifestEntry) -> int:
    """About how many bytes ``entry`` takes as a ``ManifestEntry`` message, without encoding
    it: its path and symlink target, its blocks (:data:`BLOCK_WIRE_BYTES` each) and 32 for
    the rest (the hub's replies are cut by this, ``hub/serve``)."""
    text = len(entry.path.encode()) + len(entry.symlink_target.encode())
    return 32 + text + BLOCK_WIRE_BYTES * len(entry.blocks)


class ManifestsMixin(CatalogBase):
    """The manifest-reading methods of :class:`~hub.catalog.Catalog`."""

    def manifest_page(
        self, snapshot_id: str, start: int, limit: int, max_bytes: int | None = None
    ) -> list[ManifestEntry]:
        """Reads a run of manifest entries in path order, in one read transaction.

        Args:
            snapshot_id: The snapshot's id.
            start: Index (in path order) of the first entry to return.
            limit: Maximum number of entries to return.
            max_bytes: Stop once the entries read reach this many bytes as messages
                (:func:`entry_wire_bytes`; at least one entry is read): a caller that cuts
                its pages by bytes decodes each entry once, not once per page it skips.

        Returns:
            Up to ``limit`` entries; fewer (possibly none) at the manifest's end or past
            ``max_bytes``.

        Raises:
            InvalidDigest: ``snapshot_id`` is malformed.
            SnapshotNotFound: No live manifest is stored under ``snapshot_id``.
            CorruptCatalog: An entry cannot be decoded.
        """
        with self.read() as txn:
            manifest = txn.manifest_number(snapshot_id)
            entries: list[ManifestEntry] = []
            if limit <= 0:
                return entries
            prefix = U64.pack(manifest)
            cursor = txn.cursor(db=self._db[b"manifests"])
            if not cursor.set_range(prefix + U64.pack(start)):
                return entries
            size = 0
            for key, value in cursor:
                if not key.startswith(prefix) or len(entries) >= limit:
                    break
                if max_bytes is not None and size >= max_bytes:
                    break
                entries.append(decode_entry(value))
                size += entry_wire_bytes(entries[-1])
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
        self,
        snapshot_id: str,
        path: str,
        after: str = "",
        limit: int = 1000,
        max_bytes: int | None = None,
    ) -> tuple[list[ManifestEntry], bool]:
        """Lists one directory of a snapshot through the ``dirs`` index, in name order.

        Reads the directory's own entry and its children only: a range scan over the
        index keys ``manifest | xxh3-128(path) | name`` and one lookup per child.

        Args:
            snapshot_id: The snapshot's id.
            path: The directory, relative to the snapshot root; ``""`` is the root.
            after: Return only children whose name sorts after this one (paging).
            limit: Maximum number of children to return, at least 1.
            max_bytes: Stop once the children read reach this many bytes as messages
                (:func:`entry_wire_bytes`; at least one is read), more following.

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
        with self.read() as txn:
            manifest = txn.manifest_number(snapshot_id)
            dirs = self._db[b"dirs"]
            if path:
                own = txn.get(dir_key(manifest, path), db=dirs)
                if own is None:
                    raise PathNotFound(f"snapshot {snapshot_id} has no entry {path!r}")
                if txn.entry(manifest, own).type != EntryType.DIRECTORY:
                    raise NotADirectory(f"{path!r} is not a directory")
            prefix = U64.pack(manifest) + dir_hash(path)
            cursor = txn.cursor(db=dirs)
            start = prefix + after.encode("utf-8")
            children: list[ManifestEntry] = []
            size = 0
            if not cursor.set_range(start):
                return children, False
            for key, value in cursor:
                if not key.startswith(prefix):
                    return children, False
                if after and key == start:
                    continue
                if len(children) == limit or (max_bytes is not None and size >= max_bytes):
                    return children, True
                entry = txn.entry(manifest, value)
                if split_path(entry.path)[0] != path:
                    raise CorruptCatalog(f"directory index of {snapshot_id} is inconsistent")
                children.append(entry)
                size += entry_wire_bytes(entry)
            return children, False

    def manifest_digest(self, snapshot_id: str) -> str:
        """Recomputes a snapshot id from the stored manifest (proof of immutability).

        Hashes the stored canonical entries exactly as
        :class:`~hub.snapshot.manifest.ManifestHasher`
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
        with self.read() as txn:
            record = txn.get(raw_id, db=self._db[b"snapshots"])
            if record is None:
                raise SnapshotNotFound(f"unknown snapshot {snapshot_id}")
            block_size, _, _, entry_count, manifest, live = SNAPSHOT.unpack(record)
            if not live:
                raise SnapshotNotFound(f"snapshot {snapshot_id} has no live version")
        hasher = ManifestHasher(block_size)
        count = 0
        prefix = U64.pack(manifest)
        while True:
            with self.read() as txn:
                cursor = txn.cursor(db=self._db[b"manifests"])
                page: list[bytes] = []
                if cursor.set_range(prefix + U64.pack(count)):
                    for key, value in cursor:
                        if not key.startswith(prefix) or len(page) >= MANIFEST_PAGE_ENTRIES:
                            break
                        page.append(value)
            for value in page:
                path = decode_entry(value).path
                try:
                    hasher.add_encoded(path, value)
                except ValueError as exc:
                    raise CorruptCatalog(f"manifest of {snapshot_id} is out of path order") from exc
                count += 1
            if len(page) < MANIFEST_PAGE_ENTRIES:
                break
        if count != entry_count:
            raise CorruptCatalog(
                f"manifest of {snapshot_id} has {count} entries, its record says {entry_count}"
            )
        return hasher.hexdigest()
