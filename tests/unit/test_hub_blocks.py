"""Cutting files into blocks and naming blocks by their xxh3-128 digest."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
import xxhash

from hub.errors import InvalidArgument
from hub.snapshot.blocks import (
    DEFAULT_BLOCK_SIZE,
    MAX_BLOCK_SIZE,
    BlockRef,
    block_digest,
    file_blocks,
    read_blocks,
    validate_block_size,
)

BLOCK = 16


def test_default_block_size_is_4_mib() -> None:
    assert DEFAULT_BLOCK_SIZE == 4 * 1024 * 1024


def test_digest_is_xxh3_128_lowercase_hex() -> None:
    digest = block_digest(b"strata")
    assert digest == xxhash.xxh3_128(b"strata").hexdigest()
    assert len(digest) == 32
    assert digest == digest.lower()
    # Known value of XXH3_128bits("") with seed 0 (xxHash reference implementation).
    assert block_digest(b"") == "99aa06d3014798d86001c324468d497f"


@pytest.mark.parametrize(
    ("size", "expected_sizes"),
    [
        (0, []),
        (1, [1]),
        (BLOCK - 1, [BLOCK - 1]),
        (BLOCK, [BLOCK]),
        (BLOCK + 1, [BLOCK, 1]),
        (2 * BLOCK + 5, [BLOCK, BLOCK, 5]),
    ],
)
def test_block_boundaries(size: int, expected_sizes: list[int]) -> None:
    data = os.urandom(size)
    blocks = list(read_blocks(io.BytesIO(data), BLOCK))
    assert [len(block.data) for block in blocks] == expected_sizes
    assert b"".join(block.data for block in blocks) == data
    for block in blocks:
        assert block.digest == xxhash.xxh3_128_hexdigest(block.data)
        assert block.ref == BlockRef(block.digest, len(block.data))


def test_equal_blocks_have_equal_digests() -> None:
    blocks = list(read_blocks(io.BytesIO(b"x" * BLOCK * 3), BLOCK))
    assert len({block.digest for block in blocks}) == 1


class _Trickle(io.RawIOBase):
    """A raw stream that returns at most 3 bytes per read, like a slow pipe."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        size = 3 if size < 0 else min(size, 3)
        part, self._data = self._data[:size], self._data[size:]
        return part


def test_short_reads_still_give_full_blocks() -> None:
    data = os.urandom(2 * BLOCK + 5)
    blocks = list(read_blocks(_Trickle(data), BLOCK))  # type: ignore[arg-type]
    assert [len(block.data) for block in blocks] == [BLOCK, BLOCK, 5]
    assert b"".join(block.data for block in blocks) == data


def test_file_blocks(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    data = os.urandom(3 * BLOCK + 1)
    path.write_bytes(data)
    refs = file_blocks(path, BLOCK)
    assert [ref.size for ref in refs] == [BLOCK, BLOCK, BLOCK, 1]
    assert refs[0].digest == block_digest(data[:BLOCK])
    assert refs[-1].digest == block_digest(data[-1:])


def test_read_blocks_streams(tmp_path: Path) -> None:
    """Blocks come out one at a time: the first is available before the file is read."""
    stream = io.BytesIO(os.urandom(10 * BLOCK))
    blocks = read_blocks(stream, BLOCK)
    next(blocks)
    assert stream.tell() == BLOCK


@pytest.mark.parametrize("size", [0, -1, MAX_BLOCK_SIZE + 1])
def test_invalid_block_sizes(size: int) -> None:
    with pytest.raises(InvalidArgument, match="invalid block size"):
        validate_block_size(size)
    with pytest.raises(InvalidArgument):
        list(read_blocks(io.BytesIO(b"abc"), size))
