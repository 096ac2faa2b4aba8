"""The block cache with every ``--policy`` as the daemon runs it (inside a HintedPolicy):
capacity never exceeded, block files match the accounting, pins never evicted."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from spoke.cache.blockcache import BlockCache
from spoke.cache.hinted import HintedPolicy
from spoke.cache.registry import POLICIES, make_policy
from spoke.cache.store import BlockStore, block_digest, open_index
from spoke.disk.layout import CacheLayout


def _blocks(n: int, size: int) -> list[tuple[str, bytes]]:
    out = []
    for i in range(n):
        data = i.to_bytes(4, "big") * (size // 4)
        out.append((block_digest(data), data))
    return out


def _cache(root: Path, capacity: int, policy: str) -> BlockCache:
    layout = CacheLayout(root)
    wrapped = HintedPolicy(make_policy(policy, capacity), in_use=2)
    return BlockCache(BlockStore(layout, open_index(layout)), wrapped, capacity)


def _on_disk(root: Path) -> int:
    return sum(f.stat().st_size for f in (root / "blocks").rglob("*") if f.is_file())


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_capacity_files_and_accounting_agree(tmp_path: Path, policy: str) -> None:
    blocks = _blocks(40, 1000)

    async def go() -> None:
        cache = _cache(tmp_path, 10_500, policy)
        for i, (d, data) in enumerate(blocks):
            await cache.admit(d, data)
            if i % 3 == 0:
                cache.record_access([blocks[i // 2][0]])
            assert cache.used_bytes <= 10_500 + 1000
            assert _on_disk(tmp_path) == cache.used_bytes
            cache.policy.check_invariants()
        assert len(cache) == 10

    asyncio.run(go())


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_pinned_blocks_survive_every_policy(tmp_path: Path, policy: str) -> None:
    blocks = _blocks(30, 1000)
    pinned = [d for d, _ in blocks[:3]]

    async def go() -> None:
        cache = _cache(tmp_path, 6_000, policy)
        for d, data in blocks[:3]:
            await cache.admit(d, data)
        cache.pin(pinned)
        for d, data in blocks[3:]:
            await cache.admit(d, data)
            cache.policy.check_invariants()
        assert all(cache.contains(d) for d in pinned)
        assert cache.pinned_bytes == 3_000 and cache.policy.capacity_bytes == 3_000
        cache.unpin(pinned)
        for d, data in _blocks(60, 1000)[30:]:
            await cache.admit(d, data)
        assert not any(cache.contains(d) for d in pinned)
        assert _on_disk(tmp_path) == cache.used_bytes <= 6_000

    asyncio.run(go())
