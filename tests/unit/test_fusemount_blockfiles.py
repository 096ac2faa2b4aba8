"""Verified block-file reads: first read verifies, damage is caught, open files are bounded."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fusemount.blockfiles import BlockFiles, CorruptBlockError
from spoke.disk.layout import CacheLayout, block_digest


def _put(layout: CacheLayout, data: bytes) -> str:
    digest = block_digest(data)
    path = layout.block_path(digest)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return digest


def test_reads_verify_once_and_serve_ranges(tmp_path: Path) -> None:
    layout = CacheLayout(tmp_path)
    data = os.urandom(100_000)
    digest = _put(layout, data)
    files = BlockFiles(layout)
    assert files.read(digest, 10, 20) == data[10:30]
    assert files.read(digest, 99_990, 50) == data[99_990:]
    assert files.read(digest, 100_000, 5) == b""
    assert files.verifications == 1
    assert files.read(block_digest(b"other"), 0, 1) is None


def test_a_flipped_byte_is_caught_even_after_a_verified_read(tmp_path: Path) -> None:
    layout = CacheLayout(tmp_path)
    data = os.urandom(50_000)
    digest = _put(layout, data)
    files = BlockFiles(layout)
    assert files.read(digest, 0, 10) == data[:10]
    with open(layout.block_path(digest), "r+b") as f:  # damage in place: same inode
        f.seek(40_000)
        f.write(bytes([data[40_000] ^ 0xFF]))
    os.utime(layout.block_path(digest), ns=(1, 1))  # make sure the mtime differs
    with pytest.raises(CorruptBlockError):
        files.read(digest, 0, 10)
    files.forget(digest)
    _put(layout, data)  # the daemon refetches it (new file, renamed into place)
    assert files.read(digest, 40_000, 1) == data[40_000:40_001]


def test_open_files_are_bounded_and_reopened_without_reverifying(tmp_path: Path) -> None:
    layout = CacheLayout(tmp_path)
    blobs = [os.urandom(1000) for _ in range(10)]
    digests = [_put(layout, b) for b in blobs]
    files = BlockFiles(layout, max_open=3)
    for d, b in zip(digests, blobs, strict=True):
        assert files.read(d, 0, 1000) == b
    assert len(files._open) == 3
    assert files.read(digests[0], 0, 1000) == blobs[0]  # reopened, identity known
    assert files.verifications == 10


def test_verified_identities_are_bounded_and_the_forgotten_is_verified_again(
    tmp_path: Path,
) -> None:
    layout = CacheLayout(tmp_path)
    blobs = [os.urandom(1000) for _ in range(8)]
    digests = [_put(layout, b) for b in blobs]
    files = BlockFiles(layout, max_open=1, max_verified=4)
    for d, b in zip(digests, blobs, strict=True):
        assert files.read(d, 0, 1000) == b
    assert list(files._verified) == digests[4:]  # the four most recently read
    assert files.read(digests[5], 0, 10) == blobs[5][:10]  # remembered: no new verification
    assert files.verifications == 8
    assert files.read(digests[0], 0, 10) == blobs[0][:10]  # forgotten: verified again
    assert files.verifications == 9
    assert len(files._verified) == 4 and digests[4] not in files._verified


def test_an_evicted_block_is_a_miss_even_with_its_file_open(tmp_path: Path) -> None:
    layout = CacheLayout(tmp_path)
    data = os.urandom(4096)
    digest = _put(layout, data)
    files = BlockFiles(layout)
    assert files.read(digest, 0, 1) == data[:1]
    layout.block_path(digest).unlink()  # the daemon evicts it
    assert files.read(digest, 100, 10) is None  # not served from the unlinked file
    _put(layout, data)  # fetched again
    assert files.read(digest, 100, 10) == data[100:110]


def test_sweep_closes_files_of_evicted_blocks(tmp_path: Path) -> None:
    layout = CacheLayout(tmp_path)
    blocks = [os.urandom(2048) for _ in range(3)]
    digests = [_put(layout, b) for b in blocks]
    files = BlockFiles(layout)
    for d in digests:
        assert files.read(d, 0, 1) is not None
    layout.block_path(digests[0]).unlink()
    layout.block_path(digests[2]).unlink()
    assert len(_deleted_open_files(tmp_path)) == 2  # their disk space is still held
    assert files.sweep() == 2
    assert _deleted_open_files(tmp_path) == []  # closed: the space is free
    assert files.sweep() == 0
    assert files.read(digests[1], 0, 2) == blocks[1][:2]


def _deleted_open_files(root: Path) -> list[str]:
    links = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(root)) and target.endswith("(deleted)"):
            links.append(target)
    return links
