"""The block cache: pins, watermarks, the hard limit, a full disk (a real small tmpfs)."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from spoke.cache.admission import CacheFull
from spoke.cache.blockcache import BlockCache
from spoke.cache.registry import make_policy
from spoke.cache.store import BlockStore, open_index
from spoke.disk.layout import CacheLayout, block_digest
from tests.component.test_spoke_fetcher import FakeHub, _scheduler
from tests.support import eventually_async


def _blocks(n: int, size: int) -> list[tuple[str, bytes]]:
    out = []
    for i in range(n):
        data = i.to_bytes(4, "big") * (size // 4)
        out.append((block_digest(data), data))
    return out


def _cache(root: Path, capacity: int, policy: str = "arc", **kw: float) -> BlockCache:
    layout = CacheLayout(root)
    return BlockCache(
        BlockStore(layout, open_index(layout)), make_policy(policy, capacity), capacity, **kw
    )


def _on_disk(root: Path) -> int:
    return sum(f.stat().st_size for f in (root / "blocks").rglob("*") if f.is_file())


@pytest.mark.parametrize("policy", ["arc", "lru"])
def test_never_more_than_capacity_plus_one_block(tmp_path: Path, policy: str) -> None:
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

    asyncio.run(go())


def test_background_eviction_from_high_to_low_watermark(tmp_path: Path) -> None:
    blocks = _blocks(20, 1000)

    async def go() -> None:
        cache = _cache(tmp_path, 20_000, high_watermark=0.5, low_watermark=0.25)
        evictor = asyncio.create_task(cache.run_evictor())
        await asyncio.sleep(0)
        for d, data in blocks[:10]:
            await cache.admit(d, data)  # 10_000 bytes = exactly the high mark: no eviction
        # Nothing to await: the evictor has no timer, it runs only when admit() sets its
        # Event (above the high mark), and a woken one evicts within a loop turn or two;
        # 0.05 s is hundreds of turns.
        await asyncio.sleep(0.05)
        assert cache.used_bytes == 10_000
        await cache.admit(*blocks[10])  # above the high mark: background evicts to low
        for _ in range(100):
            await asyncio.sleep(0.01)
            if cache.used_bytes <= 5_000:
                break
        assert cache.used_bytes == 5_000
        evictor.cancel()

    asyncio.run(go())


def test_pinned_blocks_are_never_evicted_and_unpin_releases(tmp_path: Path) -> None:
    blocks = _blocks(12, 1000)
    pinned = [d for d, _ in blocks[:4]]

    async def go() -> None:
        cache = _cache(tmp_path, 6_000)
        cache.pin(pinned[:2])  # pinned before they arrive
        for d, data in blocks[:4]:
            await cache.admit(d, data)
        cache.pin(pinned[2:])  # pinned once resident
        for d, data in blocks[4:]:
            await cache.admit(d, data)
        assert all(cache.contains(d) for d in pinned)
        assert cache.pinned_bytes == 4_000 and cache.used_bytes <= 6_000 + 1000
        cache.policy.check_invariants()
        cache.unpin(pinned)
        assert cache.pinned_bytes == 0
        for d, data in _blocks(30, 1000)[12:]:
            await cache.admit(d, data)
        assert not any(cache.contains(d) for d in pinned)

    asyncio.run(go())


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs: a cache disk that really fills up."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_evicts_and_continues(tiny_fs: Path) -> None:
    blocks = _blocks(12, 200_000)  # 2.4 MB through a 1 MiB disk, cache size far larger
    layout = CacheLayout(tiny_fs)

    async def go() -> None:
        cache = BlockCache(
            BlockStore(layout, open_index(layout)), make_policy("arc", 1 << 30), 1 << 30
        )
        for d, data in blocks:
            await cache.admit(d, data)
            assert cache.contains(d)
            assert layout.block_path(d).read_bytes() == data
        cache.policy.check_invariants()

    asyncio.run(go())


def test_full_disk_with_everything_pinned_streams_through(tiny_fs: Path) -> None:
    blocks = _blocks(8, 200_000)
    layout = CacheLayout(tiny_fs)
    hub = FakeHub(dict(blocks))

    async def go() -> None:
        cache = BlockCache(
            BlockStore(layout, open_index(layout)), make_policy("arc", 1 << 30), 1 << 30
        )
        cache.pin(d for d, _ in blocks)
        scheduler = _scheduler(hub, cache)
        streamed = {}
        for d, data in blocks:
            _, uncached = await scheduler.ensure([(d, len(data))])
            streamed.update(uncached)
        assert streamed, "the disk never filled"
        for d, data in streamed.items():
            assert data == dict(blocks)[d] and not cache.contains(d)
        with pytest.raises(CacheFull):
            d, data = next((d, b) for d, b in blocks if d in streamed)
            await cache.admit(d, data)

    asyncio.run(go())


def test_concurrent_admissions_never_exceed_capacity(tmp_path: Path) -> None:
    blocks = _blocks(30, 1000)

    async def go() -> None:
        cache = _cache(tmp_path, 10_000)
        await asyncio.gather(*(cache.admit(d, data) for d, data in blocks))
        assert cache.used_bytes <= 10_000 and _on_disk(tmp_path) == cache.used_bytes
        assert cache.free_bytes == 10_000 - cache.used_bytes
        cache.policy.check_invariants()

    asyncio.run(go())


def test_hinted_policy_evicts_on_demand_only(tmp_path: Path) -> None:
    from spoke.cache.hinted import HintedPolicy

    blocks = _blocks(12, 1000)

    async def go() -> None:
        layout = CacheLayout(tmp_path)
        policy = HintedPolicy(make_policy("arc", 10_000))
        cache = BlockCache(BlockStore(layout, open_index(layout)), policy, 10_000)
        evictor = asyncio.create_task(cache.run_evictor())
        policy.set_hint([d for d, _ in blocks])
        for d, data in blocks:
            await cache.admit(d, data)
            await asyncio.sleep(0.01)  # the evictor could run here (a woken one takes a turn)
        # no watermark band: the cache stays full, evicting a block per admission
        assert cache.used_bytes == 10_000 and len(cache) == 10
        policy.clear_hint()
        await cache.admit(*_blocks(13, 1000)[12])
        await eventually_async(lambda: cache.used_bytes <= cache.low_bytes, "evicted to low")
        assert cache.used_bytes <= cache.low_bytes  # without a hint the band is back
        evictor.cancel()

    asyncio.run(go())


def test_write_many_refuses_one_block_and_keeps_the_others(tmp_path: Path) -> None:
    layout = CacheLayout(tmp_path)
    store = BlockStore(layout, open_index(layout))
    (a, da), (b, db) = _blocks(2, 100)
    layout.block_path(b).parent.mkdir(parents=True, exist_ok=True)
    layout.block_path(b).mkdir()  # a directory where b's file must go: the rename fails
    errors = store.write_many([(a, da, 1), (b, db, 2)])
    assert errors[0] is None and isinstance(errors[1], OSError)
    assert layout.block_path(a).read_bytes() == da
    assert {blk.digest for blk in store} == {a}  # only a is indexed
    assert not [p for p in layout.block_path(b).parent.iterdir() if p.name.startswith(".tmp")]


@pytest.mark.parametrize("policy", ["arc", "lru"])
def test_a_cache_fully_pinned_streams_unpinned_blocks_through(tmp_path: Path, policy: str) -> None:
    """Issue 17 item 1: with every byte pinned, unpinned reads stream through (never
    admitted then evicted), and neither the index nor the files exceed the cache size."""
    blocks = _blocks(20, 1000)
    pinned, unpinned = blocks[:6], blocks[6:]
    hub = FakeHub(dict(blocks))

    async def go() -> None:
        cache = _cache(tmp_path, 6_000, policy)
        scheduler = _scheduler(hub, cache)
        cache.pin(d for d, _ in pinned)
        await scheduler.ensure([(d, len(b)) for d, b in pinned])
        assert cache.used_bytes == cache.pinned_bytes == 6_000
        for d, data in unpinned:
            was_cached, uncached = await scheduler.ensure([(d, len(data))])
            assert was_cached == [False] and uncached == {d: data}
            assert not cache.contains(d) and not cache.store.layout.block_path(d).exists()
            assert cache.used_bytes <= 6_000 and _on_disk(tmp_path) <= 6_000
        assert all(cache.contains(d) for d, _ in pinned)
        with pytest.raises(CacheFull):
            await cache.admit(*unpinned[0])
        cache.policy.check_invariants()

    asyncio.run(go())


def test_a_cache_almost_fully_pinned_keeps_the_rest_within_its_size(tmp_path: Path) -> None:
    blocks = _blocks(20, 1000)
    hub = FakeHub(dict(blocks))

    async def go() -> None:
        cache = _cache(tmp_path, 6_500)
        scheduler = _scheduler(hub, cache)
        cache.pin(d for d, _ in blocks[:5])
        await scheduler.ensure([(d, len(b)) for d, b in blocks[:5]])
        streamed = 0
        for d, data in blocks[5:]:  # one unpinned block fits at a time
            _, uncached = await scheduler.ensure([(d, len(data))])
            streamed += len(uncached)
            assert cache.used_bytes <= 6_500 and _on_disk(tmp_path) == cache.used_bytes
        assert streamed == 0 and cache.used_bytes == 6_000
        # several at once: what fits is cached, the rest streams through
        await asyncio.gather(*(scheduler.ensure([(d, len(b))]) for d, b in blocks[12:]))
        assert cache.used_bytes <= 6_500 and _on_disk(tmp_path) == cache.used_bytes

    asyncio.run(go())


def test_block_files_gone_from_the_disk_are_dropped_as_misses(tmp_path: Path) -> None:
    blocks = _blocks(5, 1000)
    hub = FakeHub(dict(blocks))

    async def go() -> None:
        cache = _cache(tmp_path, 10_000)
        scheduler = _scheduler(hub, cache)
        refs = [(d, len(b)) for d, b in blocks]
        await scheduler.ensure(refs)
        for d, _ in blocks[:2]:
            cache.store.layout.block_path(d).unlink()
        assert cache.confirm_resident(d for d, _ in refs) == 2
        assert len(cache) == 3 and cache.used_bytes == 3_000
        assert {b.digest for b in cache.store} == {d for d, _ in blocks[2:]}
        was_cached, _ = await scheduler.ensure(refs)
        assert was_cached == [False, False, True, True, True]
        assert _on_disk(tmp_path) == cache.used_bytes == 5_000

    asyncio.run(go())
