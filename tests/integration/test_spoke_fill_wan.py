"""Background fill against a real hub behind the emulated WAN (bench/wan.py, 50 ms RTT):
a demand miss during a fill is served next to it, not after it, and a fill survives a link
cut (blackhole or reset) and finishes by itself with every block verified."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from bench.wan import LinkSpec, parse_hostport
from bench.wanlink import WanLink
from deploy.local import LocalStack
from spoke.cache.blockcache import BlockCache
from spoke.cache.lru import LRUPolicy
from spoke.cache.store import BlockStore, open_index
from spoke.catalog.catalog import SnapshotCatalog
from spoke.catalog.snapshots import SnapshotIndex
from spoke.disk.layout import CacheLayout
from spoke.fetch.fetcher import Fetcher
from spoke.fetch.scheduler import FetchScheduler
from spoke.fetch.window import LinkWindow
from spoke.hublink.client import HubClient
from spoke.hublink.source import HubSource
from spoke.prefetch.fill import BATCH_BYTES, PARALLEL_BATCHES, BackgroundFill
from tests.support import eventually_async, publish

BLOCK = 256 << 10
FILES = 192  # 48 MiB: about 2 s of a 200 Mbit/s link
RTT = 0.05
RATE = 200e6  # bits/s


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> object:
    root = tmp_path_factory.mktemp("fillwan")
    src = root / "src" / "c"
    src.mkdir(parents=True)
    for i in range(FILES):
        (src / str(i)).write_bytes(os.urandom(BLOCK))
    assert publish(root / "hub", "ds", root / "src", "--block-size", str(BLOCK)) == "v1"
    with LocalStack() as stack:
        yield stack.start_hub(root / "hub")


async def _fill_over_the_link(hub: str, cache_dir: Path, cut: str) -> dict[str, float]:
    spec = LinkSpec(rtt_s=RTT, rate_bps=RATE)
    async with WanLink(parse_hostport(hub), spec) as link:
        client = HubClient(link.address)
        layout = CacheLayout(cache_dir)
        env = open_index(layout)
        cache = BlockCache(BlockStore(layout, env), LRUPolicy(1 << 30), 1 << 30)
        fetcher = Fetcher(HubSource(client), miss_deadline=60, stream_timeout=3)
        window = LinkWindow(floor=1 << 20)
        scheduler = FetchScheduler(fetcher, cache, window=window)
        index = SnapshotIndex()
        snapshot = index.learn("ds@v1", await SnapshotCatalog(client, env).manifest("ds", "v1"))
        fill = BackgroundFill(index, scheduler, cache, recheck_s=0.2)
        runner = asyncio.create_task(fill.run())
        try:
            digests = list(snapshot.sizes)
            fill.observe(digests[:1], hit=False)
            state = fill.fills["ds@v1"]
            await eventually_async(
                lambda: state.bytes_filled >= 2 * BLOCK, "two blocks filled", interval=0.005
            )
            last = digests[-1]
            assert not cache.contains(last) and state.bytes_resident < state.bytes_total // 2
            wire = scheduler.wire_bytes
            started = time.monotonic()
            await scheduler.ensure([(last, BLOCK)])  # a reader jumps to the end
            waited = time.monotonic() - started
            left_then = state.bytes_total - state.bytes_resident
            link.cut(cut)
            await asyncio.sleep(1.0)  # product interval: the link stays cut for a second
            link.restore()
            await eventually_async(
                lambda: state.state == "done", lambda: str(state.public()), 60, 0.05
            )
            assert all(cache.contains(d) and cache.store.verify(d) for d in digests)
            return {"waited": waited, "wire": wire, "left": left_then}
        finally:
            runner.cancel()
            await scheduler.close()
            await client.close()
            env.close()


@pytest.mark.parametrize("cut", ["blackhole", "reset"])
def test_demand_during_fill_and_a_cut(hub: str, tmp_path: Path, cut: str) -> None:
    got = asyncio.run(_fill_over_the_link(hub, tmp_path / "cache", cut))
    rate = RATE / 8
    # behind at most what was on the wire (one window), never behind the fill's queue
    bound = 2 * RTT + (got["wire"] + BLOCK) / rate + 0.3  # + slack for a loaded machine
    queued = min(got["left"], PARALLEL_BATCHES * BATCH_BYTES)  # the fill's queue then
    behind_fill = queued / rate  # had it waited behind the fill's queue
    print(f"demand miss during fill: {got['waited']:.3f} s (bound {bound:.3f} s)")
    assert got["waited"] <= bound < behind_fill
