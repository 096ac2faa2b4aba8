"""Splitting file bytes into content-addressed blocks.

A file of ``n`` bytes is cut into ``ceil(n / block_size)`` blocks; block ``i`` covers
bytes ``[i * block_size, min(n, (i + 1) * block_size))``. A file no larger than
``block_size`` is one block and an empty file has no blocks, so a block is never empty.
Each block is named by the xxh3-128 digest of its bytes as 32 lowercase hex characters
(xxHash spec, https://github.com/Cyan4973/xxHash/blob/dev/doc/xxhash_spec.md).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import xxhash

from hub.errors import InvalidArgument

MiB = 1024 * 1024
DEFAULT_BLOCK_SIZE = 4 * MiB
"""Default maximum block length, bytes (4 MiB)."""

MAX_BLOCK_SIZE = 64 * MiB
"""Largest block size a snapshot may use, bytes; bounds the memory of one block in flight."""


@dataclass(frozen=True, slots=True)
class BlockRef:
    """A block as a manifest names it.

    Attributes:
        digest: xxh3-128 of the block's bytes, 32 lowercase hex characters.
        size: Block length in bytes, 1 to the snapshot's block size.
    """

    digest: str
    size: int


@dataclass(frozen=True, slots=True)
class Block:
    """A block with its bytes, as produced while reading a file.

    Attributes:
        digest: xxh3-128 of ``data``, 32 lowercase hex characters.
        data: The block's bytes, never empty.
    """

    digest: str
    data: bytes

    @property
    def ref(self) -> BlockRef:
        """The block's manifest reference (digest and length in bytes)."""
        return BlockRef(self.digest, len(self.data))


def block_digest(data: bytes) -> str:
    """Computes a block's digest.

    Args:
        data: The block's bytes.

    Returns:
        ``xxh3_128`` of ``data`` as 32 lowercase hex characters (xxHash spec).
    """
    return xxhash.xxh3_128_hexdigest(data)


def validate_block_size(block_size: int) -> int:
    """Checks a block size.

    Args:
        block_size: Maximum block length, bytes.

    Returns:
        ``block_size``, unchanged.

    Raises:
        InvalidArgument: ``block_size`` is not between 1 and :data:`MAX_BLOCK_SIZE` bytes.
    """
    if not 1 <= block_size <= MAX_BLOCK_SIZE:
        raise InvalidArgument(
            f"invalid block size {block_size}: expected 1 to {MAX_BLOCK_SIZE} bytes"
        )
    return block_size


def _read_full(stream: BinaryIO, size: int) -> bytes:
    """Reads ``size`` bytes, fewer only at end of file (unbuffered reads may come up short)."""
    parts: list[bytes] = []
    wanted = size
    while wanted > 0:
        part = stream.read(wanted)
        if not part:
            break
        parts.append(part)
        wanted -= len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def read_blocks(stream: BinaryIO, block_size: int = DEFAULT_BLOCK_SIZE) -> Iterator[Block]:
    """Splits a stream into blocks, holding one block in memory at a time.

    Args:
        stream: A binary stream positioned at the start of the file's bytes.
        block_size: Maximum block length, bytes.

    Yields:
        The blocks in file order; every block but the last is exactly ``block_size`` bytes.

    Raises:
        InvalidArgument: ``block_size`` is out of range.
        OSError: Reading the stream failed.
    """
    validate_block_size(block_size)
    while data := _read_full(stream, block_size):
        yield Block(block_digest(data), data)


def file_blocks(
    path: str | os.PathLike[str], block_size: int = DEFAULT_BLOCK_SIZE
) -> list[BlockRef]:
    """Lists the blocks of a file without keeping its bytes.

    Args:
        path: A regular file.
        block_size: Maximum block length, bytes.

    Returns:
        The file's block references in file order (empty for an empty file).

    Raises:
        InvalidArgument: ``block_size`` is out of range.
        OSError: The file cannot be read.
    """
    with Path(path).open("rb") as stream:
        return [block.ref for block in read_blocks(stream, block_size)]
