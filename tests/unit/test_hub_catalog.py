"""The catalog contract: versions, tags, snapshots and paged manifests, on every engine
(LMDB and PostgreSQL, :mod:`tests.catalogs`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hub.catalog import Catalog, CatalogTxn, Dataset, Tag
from hub.errors import (
    CatalogError,
    DatasetNotFound,
    InvalidDigest,
    InvalidName,
    RefNotFound,
    SnapshotNotFound,
)
from hub.snapshot.blocks import BlockRef, block_digest
from hub.snapshot.manifest import EntryType, ManifestEntry, snapshot_id
from tests.catalogs import CatalogAt
from tests.unit.hub_support import add_version


def tree(n_files: int, content: bytes = b"abc") -> list[ManifestEntry]:
    """A manifest of ``n_files`` files under one directory, in path order."""
    digest = block_digest(content)
    entries = [ManifestEntry("dir", EntryType.DIRECTORY, 0o755, 0, 1)]
    for i in range(n_files):
        entries.append(
            ManifestEntry(
                f"dir/f{i:05d}",
                EntryType.FILE,
                0o644,
                len(content),
                i,
                blocks=(BlockRef(digest, len(content)),),
            )
        )
    return entries


@pytest.fixture
def catalog(tmp_path: Path, engine: CatalogAt) -> Iterator[Catalog]:
    with engine.open(tmp_path) as opened:
        yield opened


def test_empty_catalog(catalog: Catalog) -> None:
    assert catalog.list_datasets() == []
    with pytest.raises(DatasetNotFound, match="unknown dataset 'f3'"):
        catalog.resolve("f3", "latest")


def test_versions_are_numbered_and_latest_moves(catalog: Catalog) -> None:
    first = add_version(catalog, "f3", 4096, tree(2), created_ns=10)
    second = add_version(catalog, "f3", 4096, tree(3), created_ns=20)
    assert (first.version, second.version) == ("v1", "v2")
    assert first.snapshot_id == snapshot_id(4096, tree(2))
    assert (first.file_count, first.total_bytes, first.entry_count) == (2, 6, 3)
    assert catalog.resolve("f3", "latest") == second
    assert catalog.resolve("f3", "v1") == first
    assert catalog.list_versions("f3") == [first, second]
    assert catalog.list_tags("f3") == [Tag("latest", "v2")]
    assert catalog.list_datasets() == [Dataset("f3", 2, "v2")]


def test_datasets_are_independent_and_listed_in_name_order(catalog: Catalog) -> None:
    add_version(catalog, "zeta", 4096, tree(1))
    add_version(catalog, "alpha", 4096, tree(1))
    add_version(catalog, "alpha", 4096, tree(2))
    # A dataset whose name is a prefix of another must not see the other's versions.
    add_version(catalog, "alpha.b", 4096, tree(1))
    assert catalog.list_datasets() == [
        Dataset("alpha", 2, "v2"),
        Dataset("alpha.b", 1, "v1"),
        Dataset("zeta", 1, "v1"),
    ]
    assert [s.version for s in catalog.list_versions("alpha.b")] == ["v1"]


def test_many_versions_sort_numerically(catalog: Catalog) -> None:
    for _ in range(12):
        add_version(catalog, "f3", 4096, tree(1))
    assert [s.version for s in catalog.list_versions("f3")] == [f"v{i}" for i in range(1, 13)]
    assert catalog.dataset("f3").latest_version == "v12"


def test_tags(catalog: Catalog) -> None:
    add_version(catalog, "f3", 4096, tree(1), tag="stable")
    add_version(catalog, "f3", 4096, tree(2), tag=None)
    assert catalog.list_tags("f3") == [Tag("stable", "v1")]
    assert catalog.set_tag("f3", "latest", "v2") == Tag("latest", "v2")
    assert catalog.set_tag("f3", "prod", "stable") == Tag("prod", "v1")
    assert catalog.resolve("f3", "prod").version == "v1"
    with pytest.raises(RefNotFound, match="no version v9"):
        catalog.set_tag("f3", "latest", "v9")
    with pytest.raises(InvalidName):
        catalog.set_tag("f3", "v3", "v1")


def test_resolve_errors(catalog: Catalog) -> None:
    add_version(catalog, "f3", 4096, tree(1))
    with pytest.raises(RefNotFound, match="no version v2"):
        catalog.resolve("f3", "v2")
    with pytest.raises(RefNotFound, match="no tag 'nightly'"):
        catalog.resolve("f3", "nightly")
    with pytest.raises(InvalidName):
        catalog.resolve("F3", "v1")
    with pytest.raises(InvalidName):
        catalog.resolve("f3", "../v1")
    with pytest.raises(DatasetNotFound):
        catalog.list_versions("nope")


def test_manifest_pages_in_path_order(catalog: Catalog) -> None:
    entries = tree(25)
    snap = add_version(catalog, "f3", 4096, entries)
    assert list(catalog.iter_manifest(snap.snapshot_id, page_entries=4)) == entries
    assert catalog.manifest_page(snap.snapshot_id, 24, 10) == entries[24:]
    assert catalog.manifest_page(snap.snapshot_id, 26, 10) == []
    with pytest.raises(SnapshotNotFound):
        catalog.manifest_page(block_digest(b"no such manifest"), 0, 10)
    with pytest.raises(InvalidDigest):
        catalog.manifest_page("not-a-digest", 0, 10)


def test_identical_snapshots_share_a_manifest(catalog: Catalog) -> None:
    first = add_version(catalog, "a", 4096, tree(3))
    second = add_version(catalog, "b", 4096, tree(3))
    assert first.snapshot_id == second.snapshot_id
    assert list(catalog.iter_manifest(second.snapshot_id)) == tree(3)


def test_empty_snapshot(catalog: Catalog) -> None:
    snap = add_version(catalog, "empty", 4096, [])
    assert (snap.file_count, snap.total_bytes, snap.entry_count) == (0, 0, 0)
    assert list(catalog.iter_manifest(snap.snapshot_id)) == []


def test_bad_input_writes_nothing(catalog: Catalog) -> None:
    entries = tree(2)
    with pytest.raises(ValueError, match="path order"):
        add_version(catalog, "f3", 4096, list(reversed(entries)))
    with pytest.raises(InvalidName):
        add_version(catalog, "f3", 4096, entries, tag="v1")
    with pytest.raises(InvalidName):
        add_version(catalog, "F3", 4096, entries)
    assert catalog.list_datasets() == []


def test_failure_inside_the_transaction_writes_nothing(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_version(catalog, "f3", 4096, tree(1))

    def explode(*args: object) -> None:
        raise RuntimeError("injected failure at the end of the write transaction")

    monkeypatch.setattr(CatalogTxn, "snapshot", explode)
    with pytest.raises(RuntimeError, match="injected"):
        add_version(catalog, "f3", 4096, tree(5), tag="other")
    monkeypatch.undo()
    assert [s.version for s in catalog.list_versions("f3")] == ["v1"]
    assert catalog.list_tags("f3") == [Tag("latest", "v1")]
    with pytest.raises(SnapshotNotFound):
        catalog.manifest_page(snapshot_id(4096, tree(5)), 0, 1)
    assert add_version(catalog, "f3", 4096, tree(5)).version == "v2"


def test_full_catalog_is_a_clear_error(tmp_path: Path) -> None:
    with Catalog(tmp_path / "small", map_size=128 * 1024) as small:
        with pytest.raises(CatalogError, match="full"):
            add_version(small, "f3", 4096, tree(5000))
        assert small.list_datasets() == []


def test_catalogs_on_one_location_see_each_others_commits(
    tmp_path: Path, engine: CatalogAt
) -> None:
    path = engine.location(tmp_path)
    with Catalog(path) as writer, Catalog(path) as reader:
        add_version(writer, "f3", 4096, tree(1))
        assert reader.resolve("f3", "latest").version == "v1"
    with Catalog(path, create=False) as reopened:
        assert reopened.list_datasets() == [Dataset("f3", 1, "v1")]


def test_missing_catalog_without_create(tmp_path: Path, engine: CatalogAt) -> None:
    with pytest.raises(CatalogError, match="no catalog"):
        engine.open(tmp_path / "absent", create=False)
    assert not (tmp_path / "absent").exists()


def test_closed_catalog_refuses_use(tmp_path: Path, engine: CatalogAt) -> None:
    catalog = engine.open(tmp_path)
    catalog.close()
    catalog.close()
    with pytest.raises(CatalogError, match="closed"):
        catalog.list_datasets()
