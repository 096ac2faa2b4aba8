"""What the spoke has stored of the hub's catalog, read and written without the hub: the
last answers (datasets, versions, tags), the manifests, the revoked versions and the last
catalog event applied, in the LMDB databases ``catalog`` and ``manifests``.

:class:`StoredCatalog` is the local half of :class:`~spoke.catalog.catalog.SnapshotCatalog`
(which asks the hub, checks its answers and stores them here); the other rooms' questions
that need no hub (invalidation, retention, the mesh's scope checks, ``/v1/cache``) are
answered here.
"""

from __future__ import annotations

from typing import TypeVar

import lmdb
from google.protobuf.message import Message

from protocol.hub.v1 import hub_pb2
from spoke.catalog.blockscope import BlockScope

M = TypeVar("M", bound=Message)

STORE_CHUNK = 8192
"""Manifest entries written per LMDB write transaction. LMDB keeps the pages a write
transaction dirtied for later ones and never frees them: one transaction of 100,000
entries left the daemon 200 bytes an entry larger for good (20 MiB; 200 MiB at a
million), a chunk of 8,192 about 2 MiB once."""


class StoredCatalog:
    """The catalog as stored in the index.

    Args:
        env: the daemon's LMDB environment (databases ``catalog`` and ``manifests``).
    """

    def __init__(self, env: lmdb.Environment) -> None:
        self._env = env
        self._catalog = env.open_db(b"catalog")
        self._manifests = env.open_db(b"manifests")
        self.scope = BlockScope(env, self._catalog)  # block -> live stored snapshots

    def forget_refs(self, dataset: str | None = None) -> None:
        """Drop stored answers about a dataset's versions and tags (every dataset's when
        ``dataset`` is None): they changed at the hub, so the next question goes there."""
        prefixes = [b"versions/", b"ref/"] if dataset is None else [f"ref/{dataset}@".encode()]
        with self._env.begin(write=True, db=self._catalog) as txn:
            if dataset is not None:
                txn.delete(b"versions/" + dataset.encode())
            for prefix in prefixes:
                cursor = txn.cursor()
                if not cursor.set_range(prefix):
                    continue
                while cursor.key().startswith(prefix):
                    if not cursor.delete():
                        break

    def mark_revoked(self, dataset: str, version: str, snapshot_id: str) -> None:
        """Remember a revoked version: it no longer resolves here, even from stored answers,
        and its blocks are no longer served to peers as that version's."""
        with self._env.begin(write=True, db=self._catalog) as txn:
            txn.put(f"revoked/{dataset}/{version}".encode(), snapshot_id.encode())
        self.scope.remove_name(snapshot_id, dataset, version)

    def is_revoked(self, dataset: str, version: str, snapshot_id: str | None = None) -> bool:
        """True once the hub said ``dataset`` ``version`` was revoked.

        Args:
            snapshot_id: the version's snapshot id now; a revocation recorded for another
                snapshot id does not count (the hub was replaced by one with another
                catalog under the same address, where that version is something else).
        """
        with self._env.begin(db=self._catalog) as txn:
            raw = txn.get(f"revoked/{dataset}/{version}".encode())
        if raw is None:
            return False
        return snapshot_id is None or not raw or raw.decode() == snapshot_id

    def revoked_snapshots(self) -> set[str]:
        """Snapshot ids of every version known to be revoked."""
        out = set()
        with self._env.begin(db=self._catalog) as txn:
            cursor = txn.cursor()
            if cursor.set_range(b"revoked/"):
                for key, value in cursor:
                    if not key.startswith(b"revoked/"):
                        break
                    out.add(value.decode())
        return out

    def stored_snapshots(self) -> list[str]:
        """Snapshot ids whose manifests are stored here."""
        out = []
        with self._env.begin(db=self._catalog) as txn:
            cursor = txn.cursor()
            prefix = b"manifest-complete/"
            if cursor.set_range(prefix):
                for key, _ in cursor:
                    if not key.startswith(prefix):
                        break
                    out.append(key[len(prefix) :].decode())
        return out

    def snapshot_dataset(self, snapshot_id: str) -> str | None:
        """The dataset a stored manifest was fetched for."""
        with self._env.begin(db=self._catalog) as txn:
            raw = txn.get(b"manifest-dataset/" + snapshot_id.encode())
        return raw.decode() if raw else None

    def stored_manifest(self, snapshot_id: str) -> list[hub_pb2.ManifestEntry]:
        """A stored manifest by snapshot id (empty if none is stored)."""
        return self._load_manifest(snapshot_id.encode()) or []

    def get_sequence(self) -> int:
        """The last catalog event sequence applied here (0: none yet)."""
        with self._env.begin(db=self._catalog) as txn:
            raw = txn.get(b"watch-sequence")
        return int(raw) if raw else 0

    def set_sequence(self, sequence: int) -> None:
        """Persist the last catalog event sequence applied."""
        with self._env.begin(write=True, db=self._catalog) as txn:
            txn.put(b"watch-sequence", str(sequence).encode())

    def _store_manifest(
        self, dataset: str, snapshot: hub_pb2.Snapshot, entries: list[hub_pb2.ManifestEntry]
    ) -> None:
        """Keep a checked manifest of ``dataset``'s ``snapshot`` (and index its blocks),
        :data:`STORE_CHUNK` entries a transaction; the last one marks it complete. A
        manifest cut short (the daemon killed) is not complete: it is fetched and written
        again (the same keys and values) when next asked for."""
        sid = snapshot.snapshot_id.encode()
        for start in range(0, len(entries), STORE_CHUNK):
            chunk = entries[start : start + STORE_CHUNK]
            with self._env.begin(write=True) as txn:
                for entry in chunk:
                    key = sid + b"\0" + entry.path.encode()
                    txn.put(key, entry.SerializeToString(), db=self._manifests)
                self.scope.index(txn, snapshot.snapshot_id, chunk, complete=False)
        with self._env.begin(write=True) as txn:
            txn.put(b"manifest-complete/" + sid, str(len(entries)).encode(), db=self._catalog)
            txn.put(b"manifest-dataset/" + sid, dataset.encode(), db=self._catalog)
            self.scope.index(txn, snapshot.snapshot_id, (), complete=True)
        self.scope.add_name(snapshot.snapshot_id, dataset, snapshot.version)

    def _load_manifest(self, sid: bytes) -> list[hub_pb2.ManifestEntry] | None:
        with self._env.begin() as txn:
            if txn.get(b"manifest-complete/" + sid, db=self._catalog) is None:
                return None
            cursor = txn.cursor(db=self._manifests)
            prefix = sid + b"\0"
            out: list[hub_pb2.ManifestEntry] = []
            if cursor.set_range(prefix):
                for key, value in cursor:
                    if not key.startswith(prefix):
                        break
                    out.append(hub_pb2.ManifestEntry.FromString(value))
            return out

    def _stored(self, key: bytes, kind: type[M]) -> M | None:
        with self._env.begin(db=self._catalog) as txn:
            raw = txn.get(key)
        return None if raw is None else kind.FromString(raw)

    def _store(self, key: bytes, answer: Message) -> None:
        with self._env.begin(write=True, db=self._catalog) as txn:
            txn.put(key, answer.SerializeToString())
