"""The spoke's stored catalog answers: the read path never waits on a silent hub; lying
answers (another dataset's snapshot, a manifest that is no tree) are refused, stored or not."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from prometheus_client import REGISTRY

from protocol.hub.v1 import hub_pb2
from spoke.cache.store import open_index
from spoke.catalog.catalog import SnapshotCatalog
from spoke.catalog.manifestcheck import check_tree, snapshot_id
from spoke.disk.layout import CacheLayout
from spoke.errors import CorruptManifest, HubUnavailable, NotFound, SnapshotMismatch
from tests.support import eventually_async


class SilentHub:
    """A hub whose answers can be held back forever (a blackholed link) or refused."""

    target = "silent-hub:0"
    refused: str | None = None  # as HubClient: a refusal of this spoke's credentials

    def __init__(self) -> None:
        self.versions = ["v1"]
        self.calls = 0
        self.open = asyncio.Event()
        self.open.set()
        self.refuse = False
        self.snapshot_suffix = ""
        self.lie: dict[tuple[str, str], tuple[str, str]] = {}  # asked -> (dataset, version)

    async def _answer(self) -> None:
        self.calls += 1
        if self.refuse:
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "down"
            )
        await self.open.wait()

    async def list_versions(self, dataset: str) -> hub_pb2.ListVersionsResponse:
        await self._answer()
        return hub_pb2.ListVersionsResponse(
            versions=[
                hub_pb2.Snapshot(
                    dataset=dataset, version=v, snapshot_id=f"id-{v}{self.snapshot_suffix}"
                )
                for v in self.versions
            ],
            tags=[hub_pb2.Tag(name="latest", version=self.versions[-1])],
        )

    async def list_datasets(self) -> hub_pb2.ListDatasetsResponse:
        await self._answer()
        return hub_pb2.ListDatasetsResponse(datasets=[hub_pb2.Dataset(name="ds")])

    async def resolve_ref(self, dataset: str, ref: str) -> hub_pb2.Snapshot:
        await self._answer()
        version = self.versions[-1] if ref == "latest" else ref
        dataset, version = self.lie.get((dataset, ref), (dataset, version))
        return hub_pb2.Snapshot(
            dataset=dataset, version=version, snapshot_id=f"id-{version}{self.snapshot_suffix}"
        )


def _catalog(tmp_path: Path, hub: SilentHub) -> SnapshotCatalog:
    return SnapshotCatalog(hub, open_index(CacheLayout(tmp_path)))  # type: ignore[arg-type]


def _names(reply: hub_pb2.ListVersionsResponse) -> list[str]:
    return [v.version for v in reply.versions]


def test_stored_answers_are_served_at_once_while_the_hub_is_silent(tmp_path: Path) -> None:
    """Issue 17 item 3: with the hub blackholed, the mount's questions answered before are
    answered from the index without waiting, and refreshed once the hub speaks again."""
    hub = SilentHub()

    async def go() -> None:
        catalog = _catalog(tmp_path, hub)
        assert _names(await catalog.list_versions("ds", stale_ok=True)) == ["v1"]
        await catalog.list_datasets(stale_ok=True)
        await catalog.resolve_ref("ds", "latest", stale_ok=True)
        hub.open.clear()  # blackholed: nothing comes back, ever
        hub.versions = ["v1", "v2"]
        for _ in range(5):  # no hub answer needed, and one refresh at a time per question
            reply = await asyncio.wait_for(catalog.list_versions("ds", stale_ok=True), 5)
            assert _names(reply) == ["v1"]
            await asyncio.wait_for(catalog.list_datasets(stale_ok=True), 5)
            snap = await asyncio.wait_for(catalog.resolve_ref("ds", "latest", stale_ok=True), 5)
            assert snap.version == "v1"
        assert hub.calls == 3 + 3
        hub.open.set()  # the link is back: the refreshes land
        for _ in range(100):
            await asyncio.sleep(0.01)
            if not catalog._refreshing:
                break
        assert _names(await catalog.list_versions("ds", stale_ok=True)) == ["v1", "v2"]
        assert (await catalog.resolve_ref("ds", "latest", stale_ok=True)).version == "v2"
        await catalog.close()

    asyncio.run(go())


def test_a_catalog_event_during_a_refresh_wins(tmp_path: Path) -> None:
    hub = SilentHub()

    async def go() -> None:
        catalog = _catalog(tmp_path, hub)
        await catalog.resolve_ref("ds", "latest", stale_ok=True)
        hub.open.clear()
        assert (await catalog.resolve_ref("ds", "latest", stale_ok=True)).version == "v1"
        catalog.forget_refs("ds")  # the tag moved while the refresh was out
        hub.open.set()
        await eventually_async(lambda: not catalog._refreshing, "the refresh landed")
        hub.versions = ["v1", "v2"]
        assert (await catalog.resolve_ref("ds", "latest", stale_ok=True)).version == "v2"
        await catalog.close()

    asyncio.run(go())


def test_without_stale_ok_the_hub_is_asked_and_its_absence_falls_back(tmp_path: Path) -> None:
    hub = SilentHub()

    async def go() -> None:
        catalog = _catalog(tmp_path, hub)
        with pytest.raises(HubUnavailable):
            hub.refuse = True
            await catalog.list_versions("ds")
        hub.refuse = False
        assert _names(await catalog.list_versions("ds")) == ["v1"]
        hub.versions = ["v1", "v2"]
        assert _names(await catalog.list_versions("ds")) == ["v1", "v2"]  # asked: fresh
        hub.refuse = True
        assert _names(await catalog.list_versions("ds")) == ["v1", "v2"]  # stored
        await catalog.close()

    asyncio.run(go())


def test_a_revocation_holds_for_its_snapshot_only(tmp_path: Path) -> None:
    """A hub replaced by one with another catalog under the same address: its v1 is another
    snapshot, which a revocation of the old v1 must not hide."""
    hub = SilentHub()

    async def go() -> None:
        catalog = _catalog(tmp_path, hub)
        catalog.mark_revoked("ds", "v1", "id-v1")
        with pytest.raises(NotFound):
            await catalog.resolve_ref("ds", "v1")
        assert _names(await catalog.list_versions("ds")) == []
        hub.snapshot_suffix = "-other-hub"
        assert (await catalog.resolve_ref("ds", "v1")).snapshot_id == "id-v1-other-hub"
        assert _names(await catalog.list_versions("ds")) == ["v1"]
        await catalog.close()

    asyncio.run(go())


def _mismatches() -> float:
    return REGISTRY.get_sample_value("strata_spoke_snapshot_mismatches_total") or 0.0


def test_a_snapshot_of_another_dataset_or_version_is_refused_and_never_stored(
    tmp_path: Path,
) -> None:
    """A hub answering ``a@latest`` with ``b``'s snapshot, or ``a@v1`` with ``a``'s v2: both
    refused, counted, and nothing stored, so a later stored answer is never the lie."""
    hub = SilentHub()
    hub.versions = ["v1", "v2"]

    async def go() -> None:
        catalog = _catalog(tmp_path, hub)
        before = _mismatches()
        hub.lie = {("a", "latest"): ("b", "v2"), ("a", "v1"): ("a", "v2")}
        with pytest.raises(SnapshotMismatch, match="given for a@latest refused: it is a snapshot"):
            await catalog.resolve_ref("a", "latest")
        with pytest.raises(SnapshotMismatch, match="given for a@v1 refused: it is version 'v2'"):
            await catalog.resolve_ref("a", "v1", stale_ok=True)
        hub.lie = {("a", "latest"): ("a", "latest")}  # a tag answered with a non-version
        with pytest.raises(SnapshotMismatch, match="its version 'latest' is not a version name"):
            await catalog.resolve_ref("a", "latest")
        assert _mismatches() == before + 3
        hub.refuse = True  # nothing was stored: with the hub down there is no answer at all
        for ref in ("latest", "v1"):
            with pytest.raises(HubUnavailable):
                await catalog.resolve_ref("a", ref)
        hub.refuse, hub.lie = False, {}
        snap = await catalog.resolve_ref("a", "latest")  # an honest answer is served
        assert (snap.dataset, snap.version) == ("a", "v2")
        await catalog.close()

    asyncio.run(go())


def test_stored_answers_are_checked_and_a_lying_refresh_keeps_the_good_one(
    tmp_path: Path,
) -> None:
    hub = SilentHub()

    async def go() -> None:
        catalog = _catalog(tmp_path, hub)
        assert (await catalog.resolve_ref("a", "latest")).dataset == "a"
        hub.lie = {("a", "latest"): ("b", "v1")}
        before = _mismatches()
        assert (await catalog.resolve_ref("a", "latest", stale_ok=True)).dataset == "a"
        for _ in range(100):  # the background refresh brought the lie, which is not kept
            await asyncio.sleep(0.01)
            if not catalog._refreshing:
                break
        assert _mismatches() == before + 1
        hub.refuse = True
        assert (await catalog.resolve_ref("a", "latest")).dataset == "a"
        # an answer stored under the name by an older spoke (or a changed index) is checked too
        catalog._store(
            b"ref/a@v1", hub_pb2.Snapshot(dataset="b", version="v1", snapshot_id="id-v1")
        )
        with pytest.raises(SnapshotMismatch, match="it is a snapshot of dataset 'b'"):
            await catalog.resolve_ref("a", "v1")  # hub down: from the index
        with pytest.raises(SnapshotMismatch):
            await catalog.resolve_ref("a", "v1", stale_ok=True)
        await catalog.close()

    asyncio.run(go())


def _entry(path: str, kind: int = hub_pb2.ENTRY_TYPE_FILE, target: str = "") -> Any:
    size = len(target.encode()) if kind == hub_pb2.ENTRY_TYPE_SYMLINK else 0
    return hub_pb2.ManifestEntry(path=path, type=kind, mode=0o644, size=size, symlink_target=target)


DIR, LINK = hub_pb2.ENTRY_TYPE_DIRECTORY, hub_pb2.ENTRY_TYPE_SYMLINK


class ManifestHub(SilentHub):
    """A hub (or a proxy) not trusted for content: it serves ``entries`` as ``ds``'s v1
    under the id they hash to, so only the paths themselves can give it away."""

    def __init__(self, entries: list[Any]) -> None:
        super().__init__()
        self.entries = entries

    async def resolve_ref(self, dataset: str, ref: str) -> hub_pb2.Snapshot:
        await self._answer()
        sid = snapshot_id(4096, self.entries)
        return hub_pb2.Snapshot(dataset=dataset, version="v1", snapshot_id=sid, block_size=4096)

    async def get_manifest(self, dataset: str, ref: str) -> list[Any]:
        await self._answer()
        return [hub_pb2.ManifestEntry.FromString(e.SerializeToString()) for e in self.entries]


def _invalid() -> float:
    return REGISTRY.get_sample_value("strata_spoke_invalid_manifests_total") or 0.0


@pytest.mark.parametrize(
    ("entries", "why"),
    [
        ([_entry("z/../z.bin")], "invalid path 'z/../z.bin': an empty, '.' or '..' component"),
        ([_entry("a/./b")], "an empty, '.' or '..' component"),
        ([_entry("a//b")], "an empty, '.' or '..' component"),
        ([_entry("a/")], "an empty, '.' or '..' component"),
        ([_entry("..")], "an empty, '.' or '..' component"),
        ([_entry("/etc/shadow")], "invalid path '/etc/shadow': empty, absolute or with NUL"),
        ([_entry("")], "empty, absolute or with NUL"),
        ([_entry("a\0b")], "empty, absolute or with NUL"),
        ([_entry("x" * 256)], "a component over 255 bytes"),
        ([_entry("f"), _entry("f-x"), _entry("f/child")], "'f/child' is inside 'f', which is no"),
        ([_entry("l", LINK, "d"), _entry("l/child")], "'l/child' is inside 'l', which is no dir"),
        ([_entry("l", LINK, "a\0b")], "symlink 'l' has an empty target or one with NUL"),
        ([_entry("t", 7)], "entry 't' has unknown type 7"),
    ],
)
def test_a_manifest_that_is_no_tree_is_refused_however_it_hashes(
    tmp_path: Path, entries: list[Any], why: str
) -> None:
    hub = ManifestHub(entries)

    async def go() -> None:
        catalog = _catalog(tmp_path, hub)
        before = _invalid()
        with pytest.raises(CorruptManifest, match="manifest of ds v1 refused: ") as caught:
            await catalog.manifest("ds", "v1")
        assert why in str(caught.value) and "\n" not in str(caught.value)
        assert _invalid() == before + 1
        sid = (await hub.resolve_ref("ds", "v1")).snapshot_id
        assert catalog.stored_manifest(sid) == []  # nothing stored
        await catalog.close()

    asyncio.run(go())


def test_names_twice_or_out_of_order_are_refused_by_the_tree_check_too() -> None:
    """The hash refuses them as well (the id cannot be computed); the tree check does not
    rely on it, for manifests stored before it existed."""
    for entries in ([_entry("a"), _entry("a")], [_entry("b"), _entry("a")]):
        with pytest.raises(ValueError, match="entry 'a' is out of path order or repeated"):
            check_tree(entries)


def test_a_valid_tree_with_implicit_directories_is_served(tmp_path: Path) -> None:
    entries = [
        _entry("a", DIR),
        _entry("a-b"),  # "-" sorts before "/": between a and its children
        _entry("a/b"),
        _entry("c/d/e"),  # c and c/d implicit, as the mount allows
        _entry("l", LINK, "a"),
    ]
    hub = ManifestHub(entries)

    async def go() -> None:
        catalog = _catalog(tmp_path, hub)
        assert [e.path for e in await catalog.manifest("ds", "v1")] == [e.path for e in entries]
        await catalog.close()

    asyncio.run(go())


def test_a_stored_manifest_that_is_no_tree_is_refused_too(tmp_path: Path) -> None:
    """An older spoke stored a lying hub's manifest without this check: refused at its
    every use after the upgrade, hub or no hub (a good one is checked once per start)."""
    hub = ManifestHub([_entry("a.bin"), _entry("z/../z.bin")])
    sid = snapshot_id(4096, hub.entries)
    env = open_index(CacheLayout(tmp_path))
    with env.begin(write=True) as txn:  # what the older spoke stored
        manifests, stored = env.open_db(b"manifests", txn=txn), env.open_db(b"catalog", txn=txn)
        for e in hub.entries:
            txn.put(sid.encode() + b"\0" + e.path.encode(), e.SerializeToString(), db=manifests)
        txn.put(b"manifest-complete/" + sid.encode(), b"2", db=stored)

    async def go() -> None:
        catalog = SnapshotCatalog(hub, env)  # type: ignore[arg-type]
        await catalog.resolve_ref("ds", "v1")  # the answer is stored too
        hub.refuse = True
        before = _invalid()
        for _ in range(2):
            with pytest.raises(CorruptManifest, match=re.escape("'z/../z.bin'")):
                await catalog.manifest("ds", "v1", stale_ok=True)
        assert _invalid() == before + 2
        await catalog.close()

    asyncio.run(go())
