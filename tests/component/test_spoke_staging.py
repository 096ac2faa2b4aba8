"""Blocks staged by the fetch threads (spoke/cache/staging.py): written with O_DIRECT where
the filesystem takes it, renamed into place by admission, read back and deleted when the
cache does not take them, and never left behind as blocks."""

from __future__ import annotations

import asyncio
import mmap
import os
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from spoke.cache.admission import Placement
from spoke.cache.blockcache import BlockCache
from spoke.cache.lru import LRUPolicy
from spoke.cache.staging import DirectWrites, Staged, write_block_file
from spoke.cache.store import BlockStore, Received, open_index
from spoke.disk.layout import TMP_PREFIX, CacheLayout, block_digest
from spoke.fetch.fetcher import Fetcher
from spoke.fetch.priority import Priority
from spoke.fetch.scheduler import FetchScheduler

SIZES = [0, 1, 4095, 4096, 4097, (1 << 20) + 3, 4 << 20]


def aligned(data: bytes) -> memoryview:
    buffer = mmap.mmap(-1, max(len(data), 1))
    buffer[: len(data)] = data
    return memoryview(buffer)[: len(data)]


@pytest.mark.parametrize("size", SIZES)
def test_direct_writes_write_the_same_bytes(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    direct = DirectWrites()
    write_block_file(str(tmp_path / "direct"), aligned(data), direct)
    write_block_file(str(tmp_path / "buffered"), data, None)
    assert (tmp_path / "direct").read_bytes() == data
    assert (tmp_path / "buffered").read_bytes() == data
    assert (tmp_path / "direct").stat().st_mode & 0o777 == 0o600


def test_a_write_o_direct_refuses_falls_back_to_the_page_cache(tmp_path: Path) -> None:
    """A buffer off a page boundary is refused by O_DIRECT (EINVAL), as a filesystem
    without it refuses: the bytes are written through the page cache, and O_DIRECT is not
    tried again."""
    data = os.urandom(3 * 4096 + 5)
    buffer = mmap.mmap(-1, len(data) + 1)
    buffer[1:] = data
    direct = DirectWrites()
    write_block_file(str(tmp_path / "f"), memoryview(buffer)[1:], direct)
    assert (tmp_path / "f").read_bytes() == data
    assert not direct.usable
    write_block_file(str(tmp_path / "g"), aligned(data), direct)
    assert (tmp_path / "g").read_bytes() == data


def _cache(tmp_path: Path, capacity: int = 1 << 30) -> BlockCache:
    layout = CacheLayout(tmp_path)
    return BlockCache(BlockStore(layout, open_index(layout)), LRUPolicy(capacity), capacity)


def _temps(tmp_path: Path) -> list[Path]:
    return [p for p in (tmp_path / "blocks").rglob(f"{TMP_PREFIX}*")]


def test_a_staged_block_is_admitted_by_a_rename(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    data = os.urandom(70_000)
    digest = block_digest(data)
    staged = cache.store.stage(digest, aligned(data), direct=True)
    assert Path(staged.path).name == TMP_PREFIX + digest and len(staged) == 70_000
    assert not cache.contains(digest), "a staged file is not a block"
    asyncio.run(cache.admit(digest, staged, Placement.AHEAD))
    assert cache.contains(digest) and cache.used_bytes == 70_000
    assert cache.store.read(digest) == data and _temps(tmp_path) == []
    # a second staging of a resident block is discarded, not admitted twice
    again = cache.store.stage(digest, aligned(data), direct=False)
    asyncio.run(cache.admit(digest, again, Placement.AHEAD))
    assert _temps(tmp_path) == [] and cache.used_bytes == 70_000
    # the index survives a restart: recover() finds the renamed block, no temp files
    assert [b.digest for b in cache.store.recover()] == [digest]


class StagingSource:
    """Yields blocks already staged, as the bulk channel's threads do."""

    verifies = True
    name = "staging-source"

    def __init__(self, store: BlockStore, blocks: dict[str, bytes]) -> None:
        self.store, self.blocks = store, blocks

    async def read_blocks(
        self, blocks: Sequence[tuple[str, int]], timeout: float, priority: Priority
    ) -> AsyncIterator[tuple[str, Received]]:
        for digest, _ in blocks:
            data = self.blocks[digest]
            yield digest, self.store.stage(digest, aligned(data), priority != Priority.DEMAND)


def test_a_staged_block_the_cache_cannot_take_streams_through(tmp_path: Path) -> None:
    cache = _cache(tmp_path, capacity=64 << 10)  # smaller than the blocks
    blobs = {block_digest(d): d for d in (os.urandom(100_000), os.urandom(100_001))}
    refs = [(d, len(b)) for d, b in blobs.items()]

    async def go() -> tuple[list[bool], dict[str, bytes]]:
        scheduler = FetchScheduler(Fetcher(StagingSource(cache.store, blobs)), cache)
        return await asyncio.wait_for(scheduler.ensure(refs), 10)

    was_cached, through = asyncio.run(go())
    assert was_cached == [False, False]
    assert through == blobs, "the readers get the bytes, read back from the staged files"
    assert _temps(tmp_path) == [] and cache.used_bytes == 0


def test_staged_blocks_through_the_scheduler_land_as_blocks(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    blobs = {block_digest(d): d for d in (os.urandom(n) for n in (1, 4096, 300_000, 5000))}
    refs = [(d, len(b)) for d, b in blobs.items()]

    async def go() -> None:
        scheduler = FetchScheduler(Fetcher(StagingSource(cache.store, blobs)), cache)
        await scheduler.ensure(refs)

    asyncio.run(go())
    assert all(cache.store.read(d) == b for d, b in blobs.items())
    assert _temps(tmp_path) == []


def test_discard_removes_the_file(tmp_path: Path) -> None:
    path = tmp_path / "x"
    path.write_bytes(b"x")
    Staged("d" * 32, 1, str(path)).discard()
    assert not path.exists()
    Staged("d" * 32, 1, str(path)).discard()  # twice: no error
