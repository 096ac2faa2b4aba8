"""The spoke's view of the hub's catalog, persisted so snapshots seen before stay usable
when the hub is down.

Manifests are immutable (a snapshot id names exactly one manifest), so once one is stored it
is always served from the local index. Tags are the only mutable names: they are resolved at
the hub when it answers, and from the last answer stored when it does not.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc.aio
import lmdb
from google.protobuf.message import Message

from protocol.hub.v1 import hub_pb2
from spoke import metrics
from spoke.errors import HubUnavailable, NotFound
from spoke.hubclient import HubClient
from spoke.source import hub_error

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)
R = TypeVar("R")


class SnapshotCatalog:
    """Datasets, versions, tags and manifests, from the hub or from the local index.

    Args:
        hub: the hub client.
        env: the daemon's LMDB environment (databases ``catalog`` and ``manifests``).
    """

    def __init__(self, hub: HubClient, env: lmdb.Environment) -> None:
        self._hub = hub
        self._env = env
        self._catalog = env.open_db(b"catalog")
        self._manifests = env.open_db(b"manifests")

    async def list_datasets(self) -> hub_pb2.ListDatasetsResponse:
        """Datasets known to the hub (or last known). Raises HubUnavailable."""
        return await self._cached(
            b"datasets", hub_pb2.ListDatasetsResponse, self._hub.list_datasets
        )

    async def list_versions(self, dataset: str) -> hub_pb2.ListVersionsResponse:
        """A dataset's versions and tags (revoked ones left out).

        Raises:
            NotFound, InvalidRequest, HubUnavailable.
        """
        reply = await self._cached(
            b"versions/" + dataset.encode(),
            hub_pb2.ListVersionsResponse,
            lambda: self._hub.list_versions(dataset),
        )
        live = [v for v in reply.versions if not self.is_revoked(dataset, v.version)]
        if len(live) != len(reply.versions):
            names = {v.version for v in live}
            return hub_pb2.ListVersionsResponse(
                versions=live, tags=[t for t in reply.tags if t.version in names]
            )
        return reply

    async def resolve_ref(self, dataset: str, ref: str) -> hub_pb2.Snapshot:
        """A version or tag's snapshot. Raises NotFound, InvalidRequest, HubUnavailable."""
        snapshot = await self._cached(
            f"ref/{dataset}@{ref}".encode(),
            hub_pb2.Snapshot,
            lambda: self._hub.resolve_ref(dataset, ref),
        )
        if self.is_revoked(dataset, snapshot.version):
            raise NotFound(f"{dataset} {snapshot.version} was revoked")
        return snapshot

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
        """Remember a revoked version: it no longer resolves here, even from stored answers."""
        with self._env.begin(write=True, db=self._catalog) as txn:
            txn.put(f"revoked/{dataset}/{version}".encode(), snapshot_id.encode())

    def is_revoked(self, dataset: str, version: str) -> bool:
        """True once the hub said ``dataset`` ``version`` was revoked."""
        with self._env.begin(db=self._catalog) as txn:
            return txn.get(f"revoked/{dataset}/{version}".encode()) is not None

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

    async def manifest(self, dataset: str, ref: str) -> list[hub_pb2.ManifestEntry]:
        """The snapshot's manifest in path order, from the index when seen before.

        Raises:
            NotFound, InvalidRequest, HubUnavailable.
        """
        snapshot = await self.resolve_ref(dataset, ref)
        sid = snapshot.snapshot_id.encode()
        stored = self._load_manifest(sid)
        if stored is not None:
            return stored
        entries = await self._call(lambda: self._hub.get_manifest(dataset, snapshot.version))
        with self._env.begin(write=True) as txn:
            for entry in entries:
                txn.put(
                    sid + b"\0" + entry.path.encode(), entry.SerializeToString(), db=self._manifests
                )
            txn.put(b"manifest-complete/" + sid, str(len(entries)).encode(), db=self._catalog)
            txn.put(b"manifest-dataset/" + sid, dataset.encode(), db=self._catalog)
        return entries

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

    async def _cached(self, key: bytes, kind: type[M], fetch: Callable[[], Awaitable[M]]) -> M:
        try:
            fresh = await self._call(fetch)
        except HubUnavailable:
            with self._env.begin(db=self._catalog) as txn:
                raw = txn.get(key)
            if raw is None:
                raise
            log.debug("hub unavailable: serving %s from the local index", key.decode())
            return kind.FromString(raw)
        with self._env.begin(write=True, db=self._catalog) as txn:
            txn.put(key, fresh.SerializeToString())
        return fresh

    async def _call(self, fetch: Callable[[], Awaitable[R]]) -> R:
        try:
            result = await fetch()
        except grpc.aio.AioRpcError as err:
            raise hub_error(err, self._hub.target) from err
        metrics.HUB_UP.set(1)
        return result
