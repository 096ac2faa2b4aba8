"""The spoke's view of the hub's catalog, persisted so snapshots seen before stay usable
when the hub is down.

Manifests are immutable (a snapshot id names exactly one manifest), so once one is stored it
is always served from the local index. Tags are the only mutable names: they are resolved at
the hub when it answers, and from the last answer stored when it does not.

Callers on the read path (the mount, ``stale_ok=True``) never wait on the hub for a question
answered before: they get the stored answer at once, and one background refresh per question
brings it up to date for the next asker (stale-while-revalidate, RFC 5861). A blackholed hub
(packets silently dropped) would otherwise hold every such question for the hub timeout. The
hub's catalog events (:mod:`spoke.upkeep.invalidation`) drop stored answers that changed, so a moved
tag is asked of the hub again.

A resolved snapshot must be the one asked for: ``ResolveRef(a, ref)`` answered with a
snapshot of another dataset, or of another version than ``ref`` when ``ref`` names a
version, is refused (a lying hub or proxy cannot serve ``b``'s properly signed tree as
``a``); with ``--publisher-key`` it must also carry the publisher's valid signature. Both
checks run on every answer, the hub's and the stored ones; a refused answer is never
stored. A manifest must hash to its snapshot id and be a tree the hub would publish (no
``..``, empty components, NUL, repeated names or entries inside a file): checked when it
arrives, and once per start for one stored before.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc.aio
import lmdb

from protocol.hub.v1 import hub_pb2
from spoke import metrics
from spoke.catalog.manifestcheck import check_tree, snapshot_id
from spoke.catalog.signature import PublisherKey
from spoke.catalog.stored import M, StoredCatalog
from spoke.errors import (
    CorruptManifest,
    HubUnavailable,
    InvalidRequest,
    NotFound,
    SnapshotMismatch,
    UnsignedSnapshot,
)
from spoke.hublink.client import HubClient
from spoke.hublink.source import hub_error

log = logging.getLogger(__name__)

R = TypeVar("R")

VERSION = re.compile(r"v[1-9][0-9]*")
"""A version name (``hub.snapshot.names``): a ref that matches names a version, any other a tag."""


class SnapshotCatalog(StoredCatalog):
    """Datasets, versions, tags and manifests, from the hub or from the local index.

    This class asks the hub, checks its answers and keeps them fresh; what is stored, and
    the lookups that read only the index, are :class:`~spoke.catalog.stored.StoredCatalog`'s.

    Args:
        hub: the hub client.
        env: the daemon's LMDB environment (databases ``catalog`` and ``manifests``).
        publisher: with ``--publisher-key``, snapshots must carry its valid signature.
    """

    def __init__(
        self, hub: HubClient, env: lmdb.Environment, publisher: PublisherKey | None = None
    ) -> None:
        super().__init__(env)
        self._hub = hub
        self._publisher = publisher
        self._refreshing: dict[bytes, asyncio.Task[None]] = {}  # key -> background refresh
        self._generation = 0  # bumped by forget_refs: older refreshes must not store
        self._trees_checked: set[str] = set()  # stored manifests checked since start

    @property
    def hub_refused(self) -> str | None:
        """Why the hub refused this spoke's credentials on its last call (None: it did not)."""
        return self._hub.refused

    async def close(self) -> None:
        """Cancel background refreshes."""
        tasks = list(self._refreshing.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def list_datasets(self, stale_ok: bool = False) -> hub_pb2.ListDatasetsResponse:
        """Datasets known to the hub (or last known). Raises HubUnavailable.

        Args:
            stale_ok: answer from the index at once when an answer is stored, refreshing it
                in the background (the read path: never wait on the hub).
        """
        return await self._cached(
            b"datasets", hub_pb2.ListDatasetsResponse, self._hub.list_datasets, stale_ok
        )

    async def list_versions(
        self, dataset: str, stale_ok: bool = False
    ) -> hub_pb2.ListVersionsResponse:
        """A dataset's versions and tags (revoked ones left out); ``stale_ok`` as in
        :meth:`list_datasets`.

        Raises:
            NotFound, InvalidRequest, HubUnavailable.
        """
        reply = await self._cached(
            b"versions/" + dataset.encode(),
            hub_pb2.ListVersionsResponse,
            lambda: self._hub.list_versions(dataset),
            stale_ok,
        )
        live = [v for v in reply.versions if not self.is_revoked(dataset, v.version, v.snapshot_id)]
        if len(live) != len(reply.versions):
            names = {v.version for v in live}
            return hub_pb2.ListVersionsResponse(
                versions=live, tags=[t for t in reply.tags if t.version in names]
            )
        return reply

    async def resolve_ref(self, dataset: str, ref: str, stale_ok: bool = False) -> hub_pb2.Snapshot:
        """A version or tag's snapshot; ``stale_ok`` as in :meth:`list_datasets`.

        Raises:
            NotFound, InvalidRequest, HubUnavailable.
            SnapshotMismatch: the answer is a snapshot of another dataset, or of another
                version than ``ref`` names (counted and logged; never stored).
            UnsignedSnapshot: a publisher key is configured and the snapshot's signature
                is missing or does not verify (counted and logged; never stored).
        """
        snapshot = await self._cached(
            f"ref/{dataset}@{ref}".encode(),
            hub_pb2.Snapshot,
            lambda: self._hub.resolve_ref(dataset, ref),
            stale_ok,
            check=lambda answer: self._check_snapshot(dataset, ref, answer),
        )
        if self.is_revoked(dataset, snapshot.version, snapshot.snapshot_id):
            raise NotFound(f"{dataset} {snapshot.version} was revoked")
        return snapshot

    def _check_snapshot(self, dataset: str, ref: str, snapshot: hub_pb2.Snapshot) -> None:
        """Refuse an answer to ``ResolveRef(dataset, ref)`` that is not what was asked for
        or, with a publisher key, not signed by it.

        Raises:
            SnapshotMismatch: ``snapshot.dataset`` is not ``dataset``; ``ref`` is a version
                and ``snapshot.version`` is another; ``ref`` is a tag and
                ``snapshot.version`` is no version name.
            UnsignedSnapshot: the signature is missing or does not verify.
        """
        asked = f"{dataset}@{ref}"
        if snapshot.dataset != dataset:
            problem = f"it is a snapshot of dataset {snapshot.dataset!r}"
        elif VERSION.fullmatch(ref) and snapshot.version != ref:
            problem = f"it is version {snapshot.version!r}"
        elif not VERSION.fullmatch(snapshot.version):
            problem = f"its version {snapshot.version!r} is not a version name"
        else:
            problem = None
        if problem is not None:
            metrics.SNAPSHOT_MISMATCHES.inc()
            message = (
                f"snapshot {snapshot.snapshot_id} given for {asked} refused: {problem}, "
                "not the one asked for"
            )
            log.error("%s", message)
            raise SnapshotMismatch(message)
        if self._publisher is not None:
            problem = self._publisher.problem(snapshot)
            if problem is not None:
                metrics.SIGNATURE_REFUSALS.inc()
                message = (
                    f"snapshot {snapshot.snapshot_id} of {dataset} {snapshot.version} "
                    f"refused: {problem} (--publisher-key {self._publisher.path})"
                )
                log.error("%s", message)
                raise UnsignedSnapshot(message)

    def forget_refs(self, dataset: str | None = None) -> None:
        """As :meth:`StoredCatalog.forget_refs`; refreshes under way no longer store."""
        self._generation += 1
        super().forget_refs(dataset)

    async def manifest(
        self, dataset: str, ref: str, stale_ok: bool = False
    ) -> list[hub_pb2.ManifestEntry]:
        """The snapshot's manifest in path order, from the index when seen before;
        ``stale_ok`` as in :meth:`list_datasets` (for resolving ``ref``).

        Raises:
            NotFound, InvalidRequest, HubUnavailable.
        """
        snapshot = await self.resolve_ref(dataset, ref, stale_ok)
        # decoding is CPU (about 6 µs an entry): in a worker thread, off the event loop
        stored = await asyncio.to_thread(self._load_manifest, snapshot.snapshot_id.encode())
        if stored is not None:
            if snapshot.snapshot_id not in self._trees_checked:  # stored by an older spoke?
                self._check_tree(dataset, snapshot, stored)
                self._trees_checked.add(snapshot.snapshot_id)
            if not self.scope.is_indexed(snapshot.snapshot_id):  # stored by an older spoke
                with self._env.begin(write=True) as txn:
                    self.scope.index(txn, snapshot.snapshot_id, stored)
            self.scope.add_name(snapshot.snapshot_id, dataset, snapshot.version)
            return stored
        entries = await self._call(lambda: self._hub.get_manifest(dataset, snapshot.version))
        self._verify(dataset, snapshot, entries)
        self._check_tree(dataset, snapshot, entries)
        self._trees_checked.add(snapshot.snapshot_id)
        self._store_manifest(dataset, snapshot, entries)
        return entries

    @staticmethod
    def _verify(
        dataset: str, snapshot: hub_pb2.Snapshot, entries: list[hub_pb2.ManifestEntry]
    ) -> None:
        """Refuse a manifest that does not hash to its snapshot id (nothing is stored).

        Raises:
            CorruptManifest: the recomputed id differs, or the entries are malformed.
        """
        try:
            got = snapshot_id(snapshot.block_size, entries)
        except ValueError as err:
            got = f"unhashable ({err})"
        if got != snapshot.snapshot_id:
            metrics.MANIFEST_MISMATCHES.inc()
            message = (
                f"manifest of {dataset} {snapshot.version} refused: it hashes to {got}, "
                f"not to its snapshot id {snapshot.snapshot_id}"
            )
            log.error("%s", message)
            raise CorruptManifest(message)

    @staticmethod
    def _check_tree(
        dataset: str, snapshot: hub_pb2.Snapshot, entries: list[hub_pb2.ManifestEntry]
    ) -> None:
        """Refuse a manifest whose paths make no tree the hub would publish, even if it
        hashes to its snapshot id (``..``, empty components, NUL, a name twice, entries
        inside a file; :func:`spoke.catalog.manifestcheck.check_tree`). Nothing is stored.

        Raises:
            CorruptManifest: an entry breaks a rule (counted, logged).
        """
        try:
            check_tree(entries)
        except ValueError as err:
            metrics.INVALID_MANIFESTS.inc()
            message = f"manifest of {dataset} {snapshot.version} refused: {err}"
            log.error("%s", message)
            raise CorruptManifest(message) from None

    async def _cached(
        self,
        key: bytes,
        kind: type[M],
        fetch: Callable[[], Awaitable[M]],
        stale_ok: bool,
        check: Callable[[M], None] | None = None,
    ) -> M:
        """The answer stored under ``key`` or fetched; ``check`` (raising) vets every
        answer before it is returned or stored, so a refused one is never kept."""
        if stale_ok:
            stored = self._stored(key, kind)
            if stored is not None:
                if key not in self._refreshing:
                    task = asyncio.create_task(self._refresh(key, fetch, self._generation, check))
                    self._refreshing[key] = task
                    task.add_done_callback(lambda _: self._refreshing.pop(key, None))
                if check is not None:
                    check(stored)
                return stored
        try:
            fresh = await self._call(fetch)
        except HubUnavailable:
            stored = self._stored(key, kind)
            if stored is None:
                raise
            log.debug("hub unavailable: serving %s from the local index", key.decode())
            if check is not None:
                check(stored)
            return stored
        if check is not None:
            check(fresh)
        self._store(key, fresh)
        return fresh

    async def _refresh(
        self,
        key: bytes,
        fetch: Callable[[], Awaitable[M]],
        generation: int,
        check: Callable[[M], None] | None = None,
    ) -> None:
        """Ask the hub again for a stored answer; keep it unless the hub says otherwise.
        Nothing is stored if a catalog event (``forget_refs``) came after ``generation``,
        nor an answer ``check`` refuses (it logged and counted why)."""
        try:
            fresh = await self._call(fetch)
            if check is not None:
                check(fresh)
        except HubUnavailable as err:
            log.debug("refresh of %s: %s; keeping the stored answer", key.decode(), err)
            return
        except CorruptManifest:  # refused (logged and counted by the check): keep the old one
            return
        except (NotFound, InvalidRequest):  # gone at the hub: the next asker learns it there
            if generation == self._generation:
                with self._env.begin(write=True, db=self._catalog) as txn:
                    txn.delete(key)
            return
        if generation == self._generation:  # no catalog event made it stale meanwhile
            self._store(key, fresh)

    async def _call(self, fetch: Callable[[], Awaitable[R]]) -> R:
        try:
            result = await fetch()
        except grpc.aio.AioRpcError as err:
            raise hub_error(err, self._hub.target, self._hub.refused) from err
        metrics.HUB_UP.set(1)
        return result
