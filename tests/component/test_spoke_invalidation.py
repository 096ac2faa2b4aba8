"""Invalidator against a fake hub: stored answers forgotten, revocations purged, resumption.

The spoke's catalog and block cache are the real ones (one LMDB index in a temporary
directory); only the hub is a stand-in whose Watch stream is scripted: each connection
yields some events, then breaks with a status code.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from protocol.hub.v1 import hub_pb2
from spoke.cache.blockcache import BlockCache
from spoke.cache.lru import LRUPolicy
from spoke.cache.store import BlockStore, open_index
from spoke.catalog.catalog import SnapshotCatalog
from spoke.catalog.manifestcheck import snapshot_id
from spoke.disk.layout import CacheLayout, block_digest
from spoke.errors import HubUnavailable, NotFound
from spoke.upkeep.invalidation import Invalidator

PUBLISHED = hub_pb2.EVENT_KIND_VERSION_PUBLISHED
TAG_MOVED = hub_pb2.EVENT_KIND_TAG_MOVED
REVOKED = hub_pb2.EVENT_KIND_VERSION_REVOKED


def _error(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), code.name)


class FakeHub:
    """Answers catalog questions from dicts; ``up = False`` makes every call UNAVAILABLE.

    ``sessions`` scripts the Watch stream: one ``(events, code)`` per connection, the
    events (those after the requested sequence) then the error ``code``; when the
    script runs out the hub says UNIMPLEMENTED, which ends :meth:`Invalidator.run`.
    """

    refused: str | None = None  # as HubClient: no credentials refused

    target = "fake-hub:0"

    def __init__(self) -> None:
        self.up = True
        self.snapshots: dict[tuple[str, str], hub_pb2.Snapshot] = {}
        self.manifests: dict[str, list[hub_pb2.ManifestEntry]] = {}
        self.real: dict[str, str] = {}  # label given to publish -> real snapshot id
        self.sessions: list[tuple[list[hub_pb2.CatalogEvent], grpc.StatusCode]] = []
        self.watched_after: list[int] = []

    def publish(self, dataset: str, version: str, label: str, blocks: dict[str, bytes]) -> None:
        """Publish a one-file tree; its real snapshot id (the spoke checks manifests against
        it) is ``self.real[label]``."""
        refs = [hub_pb2.BlockRef(digest=d, size=len(b)) for d, b in blocks.items()]
        manifest = [
            hub_pb2.ManifestEntry(
                path="a.bin",
                type=hub_pb2.ENTRY_TYPE_FILE,
                size=sum(len(b) for b in blocks.values()),
                blocks=refs,
            )
        ]
        sid = snapshot_id(0, manifest)
        self.real[label] = sid
        self.snapshots[(dataset, version)] = hub_pb2.Snapshot(
            dataset=dataset, version=version, snapshot_id=sid
        )
        self.manifests[sid] = manifest

    def _check(self) -> None:
        if not self.up:
            raise _error(grpc.StatusCode.UNAVAILABLE)

    async def list_versions(self, dataset: str) -> hub_pb2.ListVersionsResponse:
        self._check()
        found = [s for (d, _), s in self.snapshots.items() if d == dataset]
        if not found:
            raise _error(grpc.StatusCode.NOT_FOUND)
        return hub_pb2.ListVersionsResponse(versions=found)

    async def resolve_ref(self, dataset: str, ref: str) -> hub_pb2.Snapshot:
        self._check()
        if (dataset, ref) not in self.snapshots:
            raise _error(grpc.StatusCode.NOT_FOUND)
        return self.snapshots[(dataset, ref)]

    async def get_manifest(self, dataset: str, ref: str) -> list[hub_pb2.ManifestEntry]:
        self._check()
        return list(self.manifests[self.snapshots[(dataset, ref)].snapshot_id])

    async def watch(self, after_sequence: int) -> AsyncIterator[hub_pb2.CatalogEvent]:
        self.watched_after.append(after_sequence)
        if not self.sessions:
            raise _error(grpc.StatusCode.UNIMPLEMENTED)
        events, code = self.sessions.pop(0)
        for event in events:
            if event.sequence > after_sequence:
                yield event
        raise _error(code)


def _event(
    sequence: int, kind: int, dataset: str, version: str = "", sid: str = ""
) -> hub_pb2.CatalogEvent:
    return hub_pb2.CatalogEvent(
        sequence=sequence, kind=kind, dataset=dataset, version=version, snapshot_id=sid
    )


def _blocks(*names: str) -> dict[str, bytes]:
    return {block_digest(n.encode() * 100): n.encode() * 100 for n in names}


class Spoke:
    """The real catalog and cache of a spoke, over one index in ``path``."""

    def __init__(self, path: Path, hub: FakeHub) -> None:
        self.layout = CacheLayout(path)
        self.env = open_index(self.layout)
        self.catalog = SnapshotCatalog(hub, self.env)  # type: ignore[arg-type]
        self.cache = BlockCache(BlockStore(self.layout, self.env), LRUPolicy(1 << 30), 1 << 30)

    def invalidator(self, hub: FakeHub) -> Invalidator:
        return Invalidator(hub, self.catalog, self.cache)  # type: ignore[arg-type]

    async def read(self, dataset: str, ref: str, blocks: dict[str, bytes]) -> None:
        """What a first read does: resolve, fetch the manifest, admit its blocks."""
        await self.catalog.manifest(dataset, ref)
        for digest, data in blocks.items():
            await self.cache.admit(digest, data)


@pytest.fixture
def hub() -> FakeHub:
    return FakeHub()


def test_a_new_version_forgets_that_datasets_stored_answers_only(
    tmp_path: Path, hub: FakeHub
) -> None:
    hub.publish("f3", "v1", "a" * 32, _blocks("x"))
    hub.publish("other", "v1", "b" * 32, _blocks("y"))
    spoke = Spoke(tmp_path, hub)

    async def go() -> None:
        await spoke.catalog.list_versions("f3")
        await spoke.catalog.list_versions("other")
        hub.up = False  # from now on only stored answers
        assert len((await spoke.catalog.list_versions("f3")).versions) == 1
        await spoke.invalidator(hub).apply(_event(1, PUBLISHED, "f3", "v2", "c" * 32))
        with pytest.raises(HubUnavailable):
            await spoke.catalog.list_versions("f3")  # forgotten: must ask the hub
        assert len((await spoke.catalog.list_versions("other")).versions) == 1

    asyncio.run(go())
    assert spoke.catalog.get_sequence() == 1


def test_a_moved_tag_is_asked_again(tmp_path: Path, hub: FakeHub) -> None:
    hub.publish("f3", "v1", "a" * 32, _blocks("x"))
    hub.snapshots[("f3", "latest")] = hub.snapshots[("f3", "v1")]
    spoke = Spoke(tmp_path, hub)

    async def go() -> str:
        await spoke.catalog.resolve_ref("f3", "latest")
        hub.publish("f3", "v2", "c" * 32, _blocks("z"))
        hub.snapshots[("f3", "latest")] = hub.snapshots[("f3", "v2")]
        stale = await spoke.catalog.resolve_ref("f3", "latest")
        assert stale.version == "v2"  # the hub is up: it answers, and the answer is stored
        hub.up = False
        await spoke.invalidator(hub).apply(_event(7, TAG_MOVED, "f3", "v2"))
        with pytest.raises(HubUnavailable):
            await spoke.catalog.resolve_ref("f3", "latest")
        hub.up = True
        return (await spoke.catalog.resolve_ref("f3", "latest")).version

    assert asyncio.run(go()) == "v2"
    assert spoke.catalog.get_sequence() == 7


def test_revocation_purges_only_blocks_no_live_snapshot_shares(
    tmp_path: Path, hub: FakeHub
) -> None:
    old, shared, new = _blocks("old"), _blocks("shared"), _blocks("new")
    hub.publish("f3", "v1", "a" * 32, {**old, **shared})
    hub.publish("f3", "v2", "b" * 32, {**shared, **new})
    spoke = Spoke(tmp_path, hub)

    async def go() -> list[str]:
        await spoke.read("f3", "v1", {**old, **shared})
        await spoke.read("f3", "v2", {**shared, **new})
        await spoke.invalidator(hub).apply(_event(3, REVOKED, "f3", "v1", hub.real["a" * 32]))
        # a hub that still answers for v1 (a lagging replica) is not believed
        with pytest.raises(NotFound, match="revoked"):
            await spoke.catalog.resolve_ref("f3", "v1")
        return [v.version for v in (await spoke.catalog.list_versions("f3")).versions]

    assert asyncio.run(go()) == ["v2"]
    assert not any(spoke.cache.contains(d) for d in old)
    assert all(spoke.cache.contains(d) for d in {**shared, **new})
    assert not any(spoke.layout.block_path(d).exists() for d in old)
    assert spoke.catalog.is_revoked("f3", "v1") and not spoke.catalog.is_revoked("f3", "v2")
    assert spoke.catalog.get_sequence() == 3


def test_purge_counts_the_blocks_it_dropped_and_spares_an_identical_live_tree(
    tmp_path: Path, hub: FakeHub
) -> None:
    blocks = _blocks("p", "q")
    hub.publish("f3", "v1", "a" * 32, blocks)
    hub.publish("f3", "v2", "a" * 32, blocks)  # republished unchanged: same snapshot id
    spoke = Spoke(tmp_path, hub)

    async def go() -> tuple[int, int]:
        await spoke.read("f3", "v1", blocks)
        invalidator = spoke.invalidator(hub)
        spared = await invalidator.purge("f3", hub.real["a" * 32])  # v2 is live with this tree
        del hub.snapshots[("f3", "v2")]  # v2 gone too, and v1 revoked: nothing keeps them
        spoke.catalog.mark_revoked("f3", "v1", hub.real["a" * 32])
        spoke.catalog.forget_refs("f3")
        return spared, await invalidator.purge("f3", hub.real["a" * 32])

    assert asyncio.run(go()) == (0, 2)
    assert not any(spoke.cache.contains(d) for d in blocks)


def test_run_resumes_after_the_last_applied_event_and_resyncs_when_history_is_gone(
    tmp_path: Path, hub: FakeHub
) -> None:
    hub.publish("f3", "v1", "a" * 32, _blocks("x"))
    spoke = Spoke(tmp_path, hub)
    spoke.catalog.set_sequence(4)  # applied before a restart
    broken, gone = grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.OUT_OF_RANGE
    hub.sessions = [
        ([_event(5, PUBLISHED, "f3", "v2"), _event(6, TAG_MOVED, "f3", "v2")], broken),
        ([_event(6, TAG_MOVED, "f3", "v2"), _event(7, PUBLISHED, "f3", "v3")], gone),
        ([_event(1, PUBLISHED, "f3", "v1")], broken),
    ]

    async def go() -> None:
        await spoke.catalog.list_versions("f3")
        await asyncio.wait_for(spoke.invalidator(hub).run(), timeout=30)

    asyncio.run(go())
    # restart at 4; after the break, resume at 6; history gone: everything from 0
    assert hub.watched_after == [4, 6, 0, 1]
    assert spoke.catalog.get_sequence() == 1
    hub.up = False
    with pytest.raises(HubUnavailable):  # the resync forgot every stored answer

        async def versions() -> None:
            await spoke.catalog.list_versions("f3")

        asyncio.run(versions())


def test_what_peers_may_be_served_follows_stored_live_snapshots(
    tmp_path: Path, hub: FakeHub
) -> None:
    """The block scope index (what the peer port may serve): every block of a manifest the
    catalog stored, by dataset, until that version is revoked; an identical tree live as
    another version keeps its blocks servable."""
    old, shared, new = _blocks("old"), _blocks("shared"), _blocks("new")
    other = _blocks("other")
    hub.publish("f3", "v1", "a" * 32, {**old, **shared})
    hub.publish("f3", "v2", "b" * 32, {**shared, **new})
    hub.publish("f3", "v3", "c" * 32, {**shared, **new})  # the same tree as v2
    hub.publish("g", "v1", "d" * 32, other)
    spoke = Spoke(tmp_path, hub)
    everything = [*old, *shared, *new, *other]

    async def go() -> dict[str, frozenset[str]]:
        assert spoke.catalog.scope.lookup(everything) == {}  # nothing stored yet
        for dataset, version in (("f3", "v1"), ("f3", "v2"), ("f3", "v3"), ("g", "v1")):
            await spoke.catalog.manifest(dataset, version)
        held = spoke.catalog.scope.lookup(everything)
        assert {d: h.datasets for d, h in held.items()} == {
            **dict.fromkeys(old, frozenset({"f3"})),
            **dict.fromkeys(shared, frozenset({"f3"})),
            **dict.fromkeys(new, frozenset({"f3"})),
            **dict.fromkeys(other, frozenset({"g"})),
        }
        sizes = {d: len(b) for d, b in {**old, **shared, **new, **other}.items()}
        assert {d: h.size for d, h in held.items()} == sizes
        assert set(spoke.catalog.scope.snapshots_of(list(new))) == {
            ("f3", "v2", hub.real["b" * 32]),
            ("f3", "v3", hub.real["b" * 32]),
        }
        invalidator = spoke.invalidator(hub)
        await invalidator.apply(_event(1, REVOKED, "f3", "v1", hub.real["a" * 32]))
        await invalidator.apply(_event(2, REVOKED, "f3", "v2", hub.real["b" * 32]))
        # a restart reads the names back from the index
        again = SnapshotCatalog(hub, spoke.env)  # type: ignore[arg-type]
        return {d: h.datasets for d, h in again.scope.lookup(everything).items()}

    held = asyncio.run(go())
    # v1's own block is gone; v2's tree is still live as v3
    assert held == {
        **dict.fromkeys(shared, frozenset({"f3"})),
        **dict.fromkeys(new, frozenset({"f3"})),
        **dict.fromkeys(other, frozenset({"g"})),
    }


def test_a_manifest_stored_before_the_scope_index_is_indexed_when_next_loaded(
    tmp_path: Path, hub: FakeHub
) -> None:
    blocks = _blocks("x", "y")
    hub.publish("f3", "v1", "a" * 32, blocks)
    spoke = Spoke(tmp_path, hub)

    async def go() -> tuple[int, int]:
        await spoke.catalog.manifest("f3", "v1")
        # what an older spoke left: the manifest, no index of its blocks, no names
        scope_db = spoke.env.open_db(b"blockscope", dupsort=True)
        catalog_db = spoke.env.open_db(b"catalog")
        with spoke.env.begin(write=True) as txn:
            txn.drop(scope_db, delete=False)
            for key in [k for k, _ in txn.cursor(db=catalog_db) if k.startswith(b"scope")]:
                txn.delete(key, db=catalog_db)
        older = SnapshotCatalog(hub, spoke.env)  # type: ignore[arg-type]
        before = len(older.scope.lookup(list(blocks)))
        hub.up = False  # the stored manifest is enough
        await older.manifest("f3", "v1", stale_ok=True)
        return before, len(older.scope.lookup(list(blocks)))

    assert asyncio.run(go()) == (0, 2)
