"""Publishing a directory tree into a data directory."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from hub.catalog import PublishSession, Tag
from hub.errors import DataDirNotFound, InvalidArgument, InvalidName, SourceError
from hub.snapshot.blocks import block_digest
from hub.snapshot.manifest import EntryType, ManifestEntry
from hub.store.blobstore import LocalBlobStore
from tests.catalogs import CatalogAt

BLOCK = 64


def make_tree(root: Path) -> dict[str, bytes]:
    """A tree with a multi-block file, an empty file, nested and empty dirs and a symlink.

    Returns:
        The regular files' contents by manifest path.
    """
    files = {
        "a.txt": b"hello strata\n",
        "data/big.bin": bytes(range(256)) * 3 + b"tail",  # 772 bytes: 12 full blocks + 4
        "data/empty.bin": b"",
        "data/nested/deep.txt": b"x" * BLOCK,
    }
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    (root / "empty-dir").mkdir()
    (root / "link").symlink_to("data/big.bin")
    (root / "dangling").symlink_to("data/../missing/nowhere")
    (root / "data" / "big.bin").chmod(0o640)
    return files


@pytest.fixture
def src(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    root.mkdir()
    make_tree(root)
    return root


def manifest(
    engine: CatalogAt, data_dir: Path, dataset: str, ref: str = "latest"
) -> dict[str, ManifestEntry]:
    with engine.open(data_dir) as catalog:
        snap = catalog.resolve(dataset, ref)
        return {entry.path: entry for entry in catalog.iter_manifest(snap.snapshot_id)}


def test_publish_records_the_tree(tmp_path: Path, src: Path, engine: CatalogAt) -> None:
    data = tmp_path / "data"
    result = engine.publish(data, "f3", src, block_size=BLOCK)
    assert (result.dataset, result.version) == ("f3", "v1")
    assert result.files == 4
    assert result.bytes == 13 + 772 + 0 + BLOCK
    entries = manifest(engine, data, "f3")
    assert list(entries) == sorted(entries)
    assert list(entries) == [
        "a.txt",
        "dangling",
        "data",
        "data/big.bin",
        "data/empty.bin",
        "data/nested",
        "data/nested/deep.txt",
        "empty-dir",
        "link",
    ]
    big = entries["data/big.bin"]
    assert big.type == EntryType.FILE
    assert big.mode == 0o640
    assert big.size == 772
    assert big.mtime_ns == (src / "data" / "big.bin").stat().st_mtime_ns
    assert [b.size for b in big.blocks] == [BLOCK] * 12 + [4]
    assert entries["data/empty.bin"].blocks == ()
    link = entries["link"]
    assert link.type == EntryType.SYMLINK
    assert link.symlink_target == "data/big.bin"
    assert link.size == len("data/big.bin")
    assert entries["dangling"].symlink_target == "data/../missing/nowhere"
    empty_dir = entries["empty-dir"]
    assert empty_dir.type == EntryType.DIRECTORY
    assert empty_dir.mode == stat.S_IMODE((src / "empty-dir").stat().st_mode)


def test_blocks_reassemble_the_files(tmp_path: Path, src: Path, engine: CatalogAt) -> None:
    data = tmp_path / "data"
    engine.publish(data, "f3", src, block_size=BLOCK)
    store = LocalBlobStore(data / "blobs")
    for path, entry in manifest(engine, data, "f3").items():
        if entry.type == EntryType.FILE:
            content = b"".join(store.read(b.digest) for b in entry.blocks)
            assert content == (src / path).read_bytes()


def test_second_publish_moves_latest_and_dedups(
    tmp_path: Path, src: Path, engine: CatalogAt
) -> None:
    data = tmp_path / "data"
    first = engine.publish(data, "f3", src, block_size=BLOCK)
    blobs_before = sorted(p.name for p in (data / "blobs").rglob("*") if p.is_file())
    assert len(blobs_before) == first.new_blocks
    # Identical content: no new blocks, same snapshot, a new version.
    again = engine.publish(data, "f3", src, block_size=BLOCK)
    assert (again.version, again.new_blocks, again.new_bytes) == ("v2", 0, 0)
    assert again.snapshot_id == first.snapshot_id
    # Change one block of the big file: exactly one new block is stored.
    big = src / "data" / "big.bin"
    content = bytearray(big.read_bytes())
    content[BLOCK * 5] ^= 0xFF
    big.write_bytes(bytes(content))
    third = engine.publish(data, "f3", src, block_size=BLOCK)
    assert third.version == "v3"
    assert (third.new_blocks, third.new_bytes) == (1, BLOCK)
    assert third.snapshot_id != first.snapshot_id
    blobs_after = sorted(p.name for p in (data / "blobs").rglob("*") if p.is_file())
    assert len(blobs_after) == len(blobs_before) + 1
    with engine.open(data) as catalog:
        assert catalog.list_tags("f3") == [Tag("latest", "v3")]
        assert catalog.resolve("f3", "v1").snapshot_id == first.snapshot_id


def test_identical_trees_have_identical_snapshot_ids(
    tmp_path: Path, src: Path, engine: CatalogAt
) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(src, copy, symlinks=True)
    for original in [*src.rglob("*"), src]:
        twin = copy / original.relative_to(src)
        st = original.lstat()
        os.utime(twin, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
    data = tmp_path / "data"
    assert engine.publish(data, "a", src).snapshot_id == engine.publish(data, "b", copy).snapshot_id


def test_snapshot_id_changes_with_metadata(tmp_path: Path, src: Path, engine: CatalogAt) -> None:
    data = tmp_path / "data"
    before = engine.publish(data, "f3", src).snapshot_id
    (src / "a.txt").chmod(0o600)
    assert engine.publish(data, "f3", src).snapshot_id != before


def test_tag_and_no_tag(tmp_path: Path, src: Path, engine: CatalogAt) -> None:
    data = tmp_path / "data"
    engine.publish(data, "f3", src, tag="stable")
    engine.publish(data, "f3", src, tag=None)
    with engine.open(data) as catalog:
        assert catalog.list_tags("f3") == [Tag("stable", "v1")]
        assert catalog.dataset("f3").latest_version == "v2"


def test_empty_source_dir(tmp_path: Path, engine: CatalogAt) -> None:
    (tmp_path / "empty").mkdir()
    result = engine.publish(tmp_path / "data", "nothing", tmp_path / "empty")
    assert (result.version, result.files, result.bytes, result.new_blocks) == ("v1", 0, 0, 0)


@pytest.mark.parametrize(
    ("dataset", "tag", "block_size", "error"),
    [
        ("F3", "latest", BLOCK, InvalidName),
        ("../x", "latest", BLOCK, InvalidName),
        ("f3", "v2", BLOCK, InvalidName),
        ("f3", "latest", 0, InvalidArgument),
    ],
)
def test_bad_arguments(
    tmp_path: Path,
    src: Path,
    dataset: str,
    tag: str,
    block_size: int,
    error: type[Exception],
    engine: CatalogAt,
) -> None:
    with pytest.raises(error):
        engine.publish(tmp_path / "data", dataset, src, tag=tag, block_size=block_size)
    assert not (tmp_path / "data").exists()


def test_missing_source(tmp_path: Path, engine: CatalogAt) -> None:
    with pytest.raises(SourceError, match="does not exist"):
        engine.publish(tmp_path / "data", "f3", tmp_path / "nope")
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(SourceError, match="not a directory"):
        engine.publish(tmp_path / "data", "f3", tmp_path / "file")


def test_data_dir_that_is_a_file(tmp_path: Path, src: Path, engine: CatalogAt) -> None:
    (tmp_path / "data").write_bytes(b"")
    with pytest.raises(DataDirNotFound, match="not a directory"):
        engine.publish(tmp_path / "data", "f3", src)


def assert_no_version(engine: CatalogAt, data: Path) -> None:
    if engine.url is not None or (data / "catalog").exists():
        with engine.open(data) as catalog:
            assert catalog.list_datasets() == []


def test_fifo_is_refused_and_nothing_is_recorded(
    tmp_path: Path, src: Path, engine: CatalogAt
) -> None:
    os.mkfifo(src / "data" / "pipe")
    with pytest.raises(SourceError, match=r"'data/pipe'.*named pipe"):
        engine.publish(tmp_path / "data", "f3", src)
    assert_no_version(engine, tmp_path / "data")


def test_non_utf8_name_is_refused(tmp_path: Path, src: Path, engine: CatalogAt) -> None:
    fd = os.open(os.path.join(os.fsencode(src), b"bad\xffname"), os.O_CREAT | os.O_WRONLY)
    os.close(fd)
    with pytest.raises(SourceError, match="not valid UTF-8"):
        engine.publish(tmp_path / "data", "f3", src)
    assert_no_version(engine, tmp_path / "data")


def test_unreadable_file_is_refused(
    tmp_path: Path, src: Path, monkeypatch: pytest.MonkeyPatch, engine: CatalogAt
) -> None:
    real_open = os.open

    def denying_open(path: object, flags: int, *args: int, **kwargs: int | None) -> int:
        if str(path).endswith("a.txt"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("hub.publish.tree.os.open", denying_open)
    with pytest.raises(SourceError, match=r"cannot read 'a\.txt': Permission denied"):
        engine.publish(tmp_path / "data", "f3", src)
    assert_no_version(engine, tmp_path / "data")


def test_failure_while_storing_blocks_leaves_no_version(
    tmp_path: Path, src: Path, monkeypatch: pytest.MonkeyPatch, engine: CatalogAt
) -> None:
    data = tmp_path / "data"
    engine.publish(data, "f3", src, block_size=BLOCK)
    (src / "new.bin").write_bytes(os.urandom(10 * BLOCK))
    real_put = LocalBlobStore.put
    calls = 0

    def failing_put(self: LocalBlobStore, digest: str, content: bytes) -> bool:
        nonlocal calls
        calls += 1
        if calls == 5:
            raise OSError(28, "No space left on device")
        return real_put(self, digest, content)

    monkeypatch.setattr(LocalBlobStore, "put", failing_put)
    with pytest.raises(Exception, match="No space left"):
        engine.publish(data, "f3", src, block_size=BLOCK)
    with engine.open(data) as catalog:
        assert [s.version for s in catalog.list_versions("f3")] == ["v1"]
        assert catalog.list_tags("f3") == [Tag("latest", "v1")]


def test_blocks_are_stored_before_the_catalog_changes(
    tmp_path: Path, src: Path, monkeypatch: pytest.MonkeyPatch, engine: CatalogAt
) -> None:
    """Every block a committed manifest names is in the store, and synced first."""
    events: list[str] = []
    real_sync = LocalBlobStore.sync
    real_commit = PublishSession.commit

    def sync(self: LocalBlobStore) -> None:
        events.append("sync")
        real_sync(self)

    def commit(self: PublishSession, *args: object, **kwargs: object) -> object:
        events.append("catalog")
        return real_commit(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(LocalBlobStore, "sync", sync)
    monkeypatch.setattr(PublishSession, "commit", commit)
    data = tmp_path / "data"
    engine.publish(data, "f3", src, block_size=BLOCK)
    assert events == ["sync", "catalog"]
    store = LocalBlobStore(data / "blobs")
    for entry in manifest(engine, data, "f3").values():
        for block in entry.blocks:
            assert store.exists(block.digest)
            assert block_digest(store.read(block.digest)) == block.digest
