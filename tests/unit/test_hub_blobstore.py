"""The local content-addressed blob store."""

from __future__ import annotations

from pathlib import Path

import pytest

from hub.errors import BlockNotFound, CorruptBlob, InvalidDigest
from hub.snapshot.blocks import block_digest
from hub.store.blobstore import TEMP_PREFIX, BlobStore, LocalBlobStore


def test_put_get_exists(tmp_path: Path) -> None:
    store: BlobStore = LocalBlobStore(tmp_path / "blobs")
    data = b"hello blocks"
    digest = block_digest(data)
    assert not store.exists(digest)
    assert store.put(digest, data) is True
    assert store.exists(digest)
    assert store.size(digest) == len(data)
    assert store.read(digest) == data
    assert store.read(digest, 6, 3) == b"blo"
    assert store.read(digest, 6) == b"blocks"
    assert (tmp_path / "blobs" / digest[:2] / digest).read_bytes() == data


def test_put_is_idempotent(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path)
    data = b"x" * 100
    digest = block_digest(data)
    assert store.put(digest, data) is True
    assert store.put(digest, data) is False
    assert store.read(digest) == data


def test_no_temp_files_are_left(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path)
    for i in range(20):
        data = str(i).encode()
        store.put(block_digest(data), data)
    store.sync()
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith(TEMP_PREFIX)]
    assert len([p for p in tmp_path.rglob("*") if p.is_file()]) == 20


def test_wrong_digest_is_refused(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path)
    with pytest.raises(CorruptBlob):
        store.put(block_digest(b"a"), b"b")
    assert not store.exists(block_digest(b"a"))


def test_unknown_and_malformed_digests(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path)
    unknown = block_digest(b"never stored")
    with pytest.raises(BlockNotFound, match=unknown):
        store.size(unknown)
    with pytest.raises(BlockNotFound):
        store.read(unknown)
    for bad in ("../../etc/passwd", "ABC", ""):
        with pytest.raises(InvalidDigest):
            store.read(bad)
        with pytest.raises(InvalidDigest):
            store.exists(bad)


def test_failed_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalBlobStore(tmp_path)
    data = b"doomed"
    digest = block_digest(data)

    def failing_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("hub.store.blobstore.os.fsync", failing_fsync)
    with pytest.raises(OSError, match="No space"):
        store.put(digest, data)
    assert not store.exists(digest)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]
