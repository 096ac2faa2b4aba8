"""Block store and cache: atomic writes, recovery after a crash, eviction to capacity."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from spoke.cache.admission import CacheFull
from spoke.cache.blockcache import BlockCache
from spoke.cache.lru import LRUPolicy
from spoke.cache.store import BlockStore, open_index
from spoke.disk.layout import CacheLayout, block_digest


def _block(i: int, size: int = 100) -> tuple[str, bytes]:
    data = bytes([i % 256]) * size
    return block_digest(data), data


def test_write_read_and_recover(tmp_path: Path) -> None:
    layout = CacheLayout(tmp_path)
    env = open_index(layout)
    store = BlockStore(layout, env)
    d1, b1 = _block(1)
    d2, b2 = _block(2)
    store.write(d1, b1, tick=1)
    store.write(d2, b2, tick=2)
    assert layout.block_path(d1).read_bytes() == b1
    assert not layout.block_path(_block(3)[0]).exists()
    # a crash mid-write leaves a temp file; a crash after rename leaves an unindexed block
    stray = layout.block_path(d1).parent / ".tmp-abc"
    stray.write_bytes(b"partial")
    d3, b3 = _block(3)
    layout.block_path(d3).parent.mkdir(exist_ok=True)
    layout.block_path(d3).write_bytes(b3)
    layout.block_path(d2).unlink()  # indexed but gone
    env.close()

    store = BlockStore(layout, open_index(layout))
    recovered = store.recover()
    assert not stray.exists()
    assert {b.digest for b in recovered} == {d1, d3}
    assert [b.digest for b in recovered][-1] == d1  # d3 got tick 0: oldest


def test_malformed_digest_never_becomes_a_path(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        CacheLayout(tmp_path).block_path("../../etc/passwd")


def test_hits_recency_reaches_the_index_at_most_once_a_second_and_at_flush(
    tmp_path: Path,
) -> None:
    layout = CacheLayout(tmp_path)
    cache = BlockCache(BlockStore(layout, open_index(layout)), LRUPolicy(1000), 1000)
    digests = []
    for i in range(3):
        d, data = _block(i)
        asyncio.run(cache.admit(d, data))
        digests.append(d)

    def stored() -> dict[str, int]:
        return {b.digest: b.tick for b in cache.store}

    admitted = stored()
    assert cache.record_access([digests[1]]) == 1  # the first batch after a quiet second
    assert stored()[digests[1]] > admitted[digests[2]]
    before = stored()
    assert cache.record_access([digests[0], "not-resident"]) == 1  # within the second
    assert stored() == before  # gathered, not yet written
    assert cache.policy.resident() == [digests[2], digests[1], digests[0]]  # the policy saw it
    cache.flush_recency()
    after = stored()
    assert after[digests[2]] < after[digests[1]] < after[digests[0]]
    cache.store._env.close()
    again = BlockCache(BlockStore(layout, open_index(layout)), LRUPolicy(1000), 1000)
    assert isinstance(again.policy, LRUPolicy)
    assert again.policy.resident() == [digests[2], digests[1], digests[0]]  # as the hits left it


def test_cache_evicts_lru_to_capacity_and_persists_recency(tmp_path: Path) -> None:
    layout = CacheLayout(tmp_path)

    async def fill() -> list[str]:
        cache = BlockCache(BlockStore(layout, open_index(layout)), LRUPolicy(350), 350)
        digests = []
        for i in range(3):
            d, data = _block(i)
            await cache.admit(d, data)
            digests.append(d)
        cache.record_access([digests[0]])  # 0 is now the most recent
        d, data = _block(9)
        await cache.admit(d, data)  # 400 > 350: evict LRU = block 1
        cache.policy.check_invariants()
        assert cache.used_bytes == 300
        assert not cache.contains(digests[1])
        assert not layout.block_path(digests[1]).exists()
        cache.store._env.close()
        return [*digests, d]

    d0, _d1, d2, d9 = asyncio.run(fill())
    cache = BlockCache(BlockStore(layout, open_index(layout)), LRUPolicy(350), 350)
    assert isinstance(cache.policy, LRUPolicy)
    assert cache.policy.resident() == [d2, d0, d9]
    # a smaller capacity after restart evicts at once, oldest first
    cache.store._env.close()
    small = BlockCache(BlockStore(layout, open_index(layout)), LRUPolicy(150), 150)
    assert isinstance(small.policy, LRUPolicy)
    assert small.policy.resident() == [d9]


def test_block_larger_than_cache_is_refused_and_the_cache_kept(tmp_path: Path) -> None:
    """--cache-size is a hard limit: a block larger than the whole cache streams through
    (CacheFull) and evicts nothing."""
    layout = CacheLayout(tmp_path)

    async def go() -> None:
        cache = BlockCache(BlockStore(layout, open_index(layout)), LRUPolicy(100), 100)
        d, data = _block(1, 60)
        await cache.admit(d, data)
        big, big_data = _block(2, 500)
        with pytest.raises(CacheFull):
            await cache.admit(big, big_data)
        assert not cache.contains(big) and cache.contains(d)
        assert cache.used_bytes == 60 and not layout.block_path(big).exists()

    asyncio.run(go())


def test_torn_block_files_after_a_power_loss_are_dropped_at_recovery(tmp_path: Path) -> None:
    """A power loss can leave a renamed block file with only part of its bytes (no fsync):
    recovery drops it, indexed or not, so it is refetched instead of failing reads."""
    layout = CacheLayout(tmp_path)
    env = open_index(layout)
    store = BlockStore(layout, env)
    blocks = [_block(i, 1000) for i in range(4)]
    for tick, (d, data) in enumerate(blocks[:3]):
        store.write(d, data, tick)
    layout.block_path(blocks[0][0]).write_bytes(blocks[0][1][:300])  # indexed, torn
    d3, b3 = blocks[3]
    layout.block_path(d3).parent.mkdir(parents=True, exist_ok=True)
    layout.block_path(d3).write_bytes(b3[:10])  # renamed, never indexed, torn
    env.close()
    store = BlockStore(layout, open_index(layout))
    assert {b.digest for b in store.recover()} == {blocks[1][0], blocks[2][0]}
    assert not layout.block_path(blocks[0][0]).exists() and not layout.block_path(d3).exists()
    assert {b.digest for b in store} == {blocks[1][0], blocks[2][0]}
