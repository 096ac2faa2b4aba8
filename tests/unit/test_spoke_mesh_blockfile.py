"""The peer port's view of a cached block: checked whole, then read a chunk at a time from
its open file, plain or sealed (encryption at rest); a damaged, cut or missing file is
never opened; the chunks sent fit what a caller accepts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from spoke.cache.store import BlockStore, open_index
from spoke.disk.encryption import SEGMENT_BYTES, BlockCipher
from spoke.disk.layout import CacheLayout, block_digest
from spoke.mesh.blockfile import BlockFile
from spoke.mesh.peerclient import CHUNK_BYTES
from spoke.mesh.peerservice import CALL_HOLD_BYTES, SERVE_CHUNK_BYTES

CHUNK = 4 * SEGMENT_BYTES


def _store(tmp_path: Path, sealed: bool) -> BlockStore:
    layout = CacheLayout(tmp_path / "cache")
    cipher = BlockCipher(os.urandom(32)) if sealed else None
    return BlockStore(layout, open_index(layout), cipher)


def _read(block: BlockFile) -> bytes:
    return b"".join(block.read(offset) for offset in block.offsets())


@pytest.mark.parametrize("sealed", [False, True], ids=["plain", "sealed"])
@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 5 * CHUNK + 7])
def test_a_block_reads_back_chunk_by_chunk(tmp_path: Path, sealed: bool, size: int) -> None:
    store = _store(tmp_path, sealed)
    data = os.urandom(size)
    digest = block_digest(data)
    store.write(digest, data, 1)
    with BlockFile.open(store, digest, size, CHUNK) as block:  # type: ignore[union-attr]
        assert len(block.offsets()) == max(1, -(-size // CHUNK))
        assert _read(block) == data
        store.delete(digest)  # evicted meanwhile: the open file still reads what was checked
        assert _read(block) == data
    assert block.fd == -1


@pytest.mark.parametrize("sealed", [False, True], ids=["plain", "sealed"])
def test_a_damaged_cut_or_missing_block_is_not_opened(tmp_path: Path, sealed: bool) -> None:
    store = _store(tmp_path, sealed)
    data = os.urandom(3 * CHUNK)
    digest = block_digest(data)
    store.write(digest, data, 1)
    path = store.layout.block_path(digest)
    raw = bytearray(path.read_bytes())
    raw[-100] ^= 1  # in the last chunk: caught before anything would be sent
    path.write_bytes(raw)
    assert BlockFile.open(store, digest, len(data), CHUNK) is None
    path.write_bytes(raw[:-1])
    assert BlockFile.open(store, digest, len(data), CHUNK) is None
    assert BlockFile.open(store, digest, len(data) + 1, CHUNK) is None  # another size
    path.unlink()
    assert BlockFile.open(store, digest, len(data), CHUNK) is None


def test_chunks_fit_callers_and_segments() -> None:
    assert SERVE_CHUNK_BYTES <= CHUNK_BYTES and SERVE_CHUNK_BYTES % SEGMENT_BYTES == 0
    assert CALL_HOLD_BYTES >= 4 * SERVE_CHUNK_BYTES
    with pytest.raises(ValueError, match="multiple"):
        BlockFile(-1, "0" * 32, 1, SEGMENT_BYTES + 1, None)
