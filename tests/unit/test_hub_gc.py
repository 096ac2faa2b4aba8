"""Revocation, garbage collection (also racing a publish) and immutability proofs."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import lmdb
import pytest

from hub.catalog import Catalog, PublishSession
from hub.errors import Conflict, RefNotFound, StorageError, VersionExists, VersionRevoked
from hub.snapshot.blocks import block_digest
from hub.store import datadir
from hub.store.blobstore import LocalBlobStore
from hub.store.gc import CANDIDATES, collect, load_candidates
from hub.store.verify import verify
from tests.catalogs import CatalogAt

BLOCK = 64


def tree(root: Path, files: dict[str, bytes]) -> Path:
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(content)
    return root


def blobs(data: Path) -> set[str]:
    return set(LocalBlobStore(data / "blobs").iter_digests())


def intact(engine: CatalogAt, data: Path, dataset: str, ref: str = "latest") -> bool:
    with engine.open(data) as catalog:
        return verify(catalog, LocalBlobStore(data / "blobs"), dataset, ref, blocks=True).ok


def test_revoke_then_gc_removes_only_unshared_blocks(tmp_path: Path, engine: CatalogAt) -> None:
    data = tmp_path / "data"
    src = tree(
        tmp_path / "src", {"same.bin": os.urandom(3 * BLOCK), "edit.bin": os.urandom(2 * BLOCK)}
    )
    v1 = engine.publish(data, "f3", src, block_size=BLOCK)
    (src / "edit.bin").write_bytes(os.urandom(2 * BLOCK))
    v2 = engine.publish(data, "f3", src, block_size=BLOCK)
    assert (v2.new_blocks, v2.new_bytes) == (2, 2 * BLOCK), "only the changed file's blocks"
    before = blobs(data)
    with engine.open(data) as catalog:
        revocation = catalog.revoke("f3", "v1")
        assert revocation.manifest_dropped
        with pytest.raises(VersionRevoked, match="f3 v1 was revoked"):
            catalog.resolve("f3", "v1")
        with pytest.raises(Conflict, match="already revoked"):
            catalog.revoke("f3", "v1")
        with pytest.raises(VersionRevoked):
            catalog.set_tag("f3", "old", "v1")
        assert [s.version for s in catalog.list_versions("f3")] == ["v2"]
        assert [s.revoked for s in catalog.list_versions("f3", include_revoked=True)] == [
            True,
            False,
        ]
        assert catalog.dataset("f3").version_count == 1
        result = collect(catalog, LocalBlobStore(data / "blobs"))
    assert result.blobs_deleted == 2 == len(before) - len(blobs(data))
    assert v1.snapshot_id != v2.snapshot_id
    assert intact(engine, data, "f3")
    again = engine.publish(data, "f3", src, block_size=BLOCK)
    assert again.version == "v3", "version numbers are never reused"


def test_revoking_removes_its_tags(tmp_path: Path, engine: CatalogAt) -> None:
    data = tmp_path / "data"
    engine.publish(data, "f3", tree(tmp_path / "src", {"a": b"a"}), tag="latest")
    with engine.open(data) as catalog:
        catalog.set_tag("f3", "prod", "v1")
        assert catalog.revoke("f3", "v1").removed_tags == ("latest", "prod")
        assert catalog.list_tags("f3") == []
        with pytest.raises(RefNotFound):
            catalog.resolve("f3", "latest")


def test_blocks_shared_across_datasets_survive_one_revocation(
    tmp_path: Path, engine: CatalogAt
) -> None:
    data = tmp_path / "data"
    src = tree(tmp_path / "src", {"a": b"shared content"})
    first, second = engine.publish(data, "one", src), engine.publish(data, "two", src)
    assert first.snapshot_id == second.snapshot_id
    with engine.open(data) as catalog:
        assert not catalog.revoke("one", "v1").manifest_dropped
        assert collect(catalog, LocalBlobStore(data / "blobs")).blobs_deleted == 0
        assert catalog.block_size(next(iter(blobs(data))), lambda d: d == "one") is None
        assert catalog.block_size(next(iter(blobs(data))), lambda d: d == "two") == 14
    assert intact(engine, data, "two")


def test_versions_are_immutable(tmp_path: Path, engine: CatalogAt) -> None:
    data = tmp_path / "data"
    src = tree(tmp_path / "src", {"a": b"a"})
    engine.publish(data, "f3", src)
    with pytest.raises(VersionExists, match="f3 v1 is already published"):
        engine.publish(data, "f3", src, version="v1")
    assert engine.publish(data, "f3", src, version="v2").version == "v2"
    with engine.open(data) as catalog:
        assert len(catalog.list_versions("f3")) == 2
        assert catalog.list_publishes() == [], "refused publishes leave nothing staged"
        snapshot = catalog.resolve("f3", "v1")
        assert catalog.manifest_digest(snapshot.snapshot_id) == snapshot.snapshot_id


def test_a_tampered_manifest_or_block_is_detected(tmp_path: Path, engine: CatalogAt) -> None:
    data = tmp_path / "data"
    engine.publish(data, "f3", tree(tmp_path / "src", {"a.txt": b"hello", "b.txt": b"world"}))
    assert intact(engine, data, "f3")
    with engine.open(data) as catalog:
        with catalog.write() as txn:
            manifests = txn.db[b"manifests"]
            key, value = next(iter(txn.cursor(db=manifests)))
            txn.put(key, value.replace(b"a.txt", b"A.txt"), db=manifests)
        snapshot = catalog.resolve("f3", "v1")
        assert catalog.manifest_digest(snapshot.snapshot_id) != snapshot.snapshot_id
    assert not intact(engine, data, "f3")


def test_gc_drops_abandoned_publishes_but_not_live_ones(tmp_path: Path, engine: CatalogAt) -> None:
    data = tmp_path / "data"
    engine.publish(data, "f3", tree(tmp_path / "src", {"a": b"a"}))
    store = LocalBlobStore(data / "blobs")
    with engine.open(data) as catalog:
        digest = block_digest(b"orphan")
        crashed = catalog.begin_publish(BLOCK)
        crashed.protect([digest])
        store.put(digest, b"orphan")
        running = catalog.begin_publish(BLOCK)
        running.protect([digest])
        assert collect(catalog, store, is_alive=lambda pid: True).blobs_deleted == 0
        assert len(catalog.list_publishes()) == 2
        running.abort()
        result = collect(catalog, store, is_alive=lambda pid: False)
        assert (result.publishes_dropped, result.blobs_deleted) == (1, 1)
        assert catalog.list_publishes() == []
        with pytest.raises(Exception, match="dropped as abandoned"):
            crashed.commit("f3")


class RacingStore(LocalBlobStore):
    """Runs a full garbage collection right before every block is stored."""

    catalog: Catalog

    def put(self, digest: str, data: bytes) -> bool:
        collect(self.catalog, self)
        return super().put(digest, data)


def test_gc_racing_a_publish_loses_no_live_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: CatalogAt
) -> None:
    """The dangerous case: a publish re-uses blobs that are garbage when it starts."""
    data = tmp_path / "data"
    files = {f"d/f{i}": os.urandom(2 * BLOCK + i) for i in range(20)}
    src = tree(tmp_path / "src", files)
    engine.publish(data, "f3", src, block_size=BLOCK)
    with engine.open(data) as catalog:
        catalog.revoke("f3", "v1")  # every blob is garbage now, but still on disk
        garbage = blobs(data)
        store = RacingStore(data / "blobs")
        store.catalog = catalog
        monkeypatch.setattr(datadir, "open_blob_store", lambda *a, **k: store)
        result = engine.publish(data, "f3", src, block_size=BLOCK)
    assert result.new_blocks == 0, "every block was protected, so gc kept it for re-use"
    assert blobs(data) == garbage
    assert intact(engine, data, "f3")


def test_the_race_test_fails_without_protection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: CatalogAt
) -> None:
    """Control: with protection disabled, the same interleaving loses blocks."""
    data = tmp_path / "data"
    src = tree(tmp_path / "src", {f"f{i}": os.urandom(BLOCK) for i in range(5)})
    engine.publish(data, "f3", src, block_size=BLOCK)
    with engine.open(data) as catalog:
        catalog.revoke("f3", "v1")
        store = RacingStore(data / "blobs")
        store.catalog = catalog

        class LyingStore(RacingStore):
            def put(self, digest: str, data: bytes) -> bool:
                stored = super().put(digest, data)
                collect(self.catalog, self)  # gc again after the (unprotected) store
                return stored

        lying = LyingStore(data / "blobs")
        lying.catalog = catalog
        monkeypatch.setattr(datadir, "open_blob_store", lambda *a, **k: lying)
        monkeypatch.setattr(PublishSession, "protect", _entries_only)
        engine.publish(data, "f3", src, block_size=BLOCK)
    assert not intact(engine, data, "f3")


def _entries_only(self: PublishSession, digests: object) -> None:
    """PublishSession.protect without the protection: writes the staged entries only."""
    _real_protect(self, ())


_real_protect = PublishSession.protect


def test_gc_concurrent_with_publishes_in_threads(tmp_path: Path, engine: CatalogAt) -> None:
    data = tmp_path / "data"
    files = {f"d{i % 4}/f{i}": os.urandom(BLOCK + i) for i in range(200)}
    src = tree(tmp_path / "src", files)
    engine.publish(data, "f3", src, block_size=BLOCK)
    with engine.open(data) as catalog:
        catalog.revoke("f3", "v1")
    done = threading.Event()
    passes = 0

    def collector() -> None:
        nonlocal passes
        with engine.open(data) as catalog:
            store = LocalBlobStore(data / "blobs")
            while not done.is_set() or passes == 0:
                collect(catalog, store)
                passes += 1

    thread = threading.Thread(target=collector)
    thread.start()
    try:
        for _ in range(3):
            engine.publish(data, "f3", src, block_size=BLOCK)
    finally:
        done.set()
        thread.join()
    assert passes > 0
    with engine.open(data) as catalog:
        collect(catalog, LocalBlobStore(data / "blobs"))
    for version in ("v2", "v3", "v4"):
        assert intact(engine, data, "f3", version)
    assert lmdb.version()


def test_unreferenced_blobs_wait_out_the_grace_and_a_reference_again_keeps_them(
    tmp_path: Path, engine: CatalogAt
) -> None:
    """v1's two own blocks become candidates at t0 and go only at t0 + grace; a publish of
    the same bytes meanwhile takes one of them off the list for good."""
    data = tmp_path / "data"
    first, second = os.urandom(BLOCK), os.urandom(BLOCK)
    src = tree(tmp_path / "src", {"a.bin": first, "b.bin": second})
    engine.publish(data, "f3", src, block_size=BLOCK)
    (src / "a.bin").write_bytes(os.urandom(BLOCK))
    (src / "b.bin").write_bytes(os.urandom(BLOCK))
    engine.publish(data, "f3", src, block_size=BLOCK)
    store = LocalBlobStore(data / "blobs")
    t0 = 1_000 * 10**9
    with engine.open(data) as catalog:
        catalog.revoke("f3", "v1")
        result = collect(catalog, store, grace_s=100, now_ns=lambda: t0)
        assert (result.blobs_deleted, result.blobs_waiting) == (0, 2)
        assert set(load_candidates(store).values()) == {t0}
        result = collect(catalog, store, grace_s=100, now_ns=lambda: t0 + 50 * 10**9)
        assert (result.blobs_deleted, result.blobs_waiting) == (0, 2)
        assert set(load_candidates(store).values()) == {t0}  # first found, not last
    again = tree(tmp_path / "again", {"a.bin": first})  # the same bytes, published anew
    engine.publish(data, "f3", again, block_size=BLOCK)
    with engine.open(data) as catalog:
        result = collect(catalog, store, grace_s=100, now_ns=lambda: t0 + 101 * 10**9)
    assert (result.blobs_deleted, result.blobs_waiting) == (1, 0)
    assert block_digest(first) in blobs(data) and block_digest(second) not in blobs(data)
    assert load_candidates(store) == {}
    assert intact(engine, data, "f3")


def test_a_cut_candidates_note_is_an_error_not_a_guess(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path / "blobs")
    store.write_note(CANDIDATES, b"x" * 23)
    with pytest.raises(StorageError, match="cut short"):
        load_candidates(store)
    with pytest.raises(ValueError):
        store.write_note("ab", b"")  # a shard's name
