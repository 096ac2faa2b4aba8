"""Retention: blocks of snapshots nobody read for longer than the retention are dropped;
blocks a fresh snapshot shares, and pinned blocks, stay; each eviction is audited."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from hub.publish.tree import publish
from hub.serve.serverthread import ServerThread
from spoke.audit import AuditLog
from spoke.cache.blockcache import BlockCache
from spoke.cache.registry import make_policy
from spoke.cache.store import BlockStore, open_index
from spoke.catalog.catalog import SnapshotCatalog
from spoke.catalog.selection import unique_blocks
from spoke.disk.layout import CacheLayout
from spoke.fetch.fetcher import Fetcher
from spoke.fetch.scheduler import FetchScheduler
from spoke.hublink.client import HubClient
from spoke.hublink.source import HubSource
from spoke.run.settings import parse_duration
from spoke.upkeep.pins import PinRegistry
from spoke.upkeep.retention import ReadClock, Retention
from tests.integration.hub_support import write_tree

DAY = 86400.0


def test_stale_snapshots_lose_their_own_blocks_only(tmp_path: Path) -> None:
    old = write_tree(tmp_path / "v1", {"a.bin": b"a" * 5000, "shared.bin": b"s" * 5000})
    new = write_tree(tmp_path / "v2", {"c.bin": b"c" * 5000, "shared.bin": b"s" * 5000})
    pinned = write_tree(tmp_path / "p", {"p.bin": b"p" * 5000})
    for name, src in (("ds", old), ("ds", new), ("pinned", pinned)):
        publish(tmp_path / "data", name, src)
    now = [1_000_000.0]

    async def main() -> None:
        layout = CacheLayout(tmp_path / "cache")
        layout.root.mkdir()
        env = open_index(layout)
        with ServerThread(tmp_path / "data") as hub_server:
            hub = HubClient(f"127.0.0.1:{hub_server.port}")
            cache = BlockCache(BlockStore(layout, env), make_policy("lru", 1 << 24), 1 << 24)
            catalog = SnapshotCatalog(hub, env)
            scheduler = FetchScheduler(Fetcher(HubSource(hub), miss_deadline=5), cache)
            pins = PinRegistry(env, cache)
            audit = AuditLog(tmp_path / "audit.jsonl")
            clock = ReadClock(lambda: now[0])
            try:
                blocks = {}
                for dataset, version in (("ds", "v1"), ("ds", "v2"), ("pinned", "v1")):
                    manifest = await catalog.manifest(dataset, version)
                    blocks[dataset, version] = unique_blocks(manifest)
                    await scheduler.ensure(list(blocks[dataset, version].items()))
                pins.add("pinned", "v1", "v1", [], blocks["pinned", "v1"])
                v1_only = set(blocks["ds", "v1"]) - set(blocks["ds", "v2"])
                shared = set(blocks["ds", "v1"]) & set(blocks["ds", "v2"])
                assert v1_only and shared
                retention = Retention(catalog, cache, clock, 7 * DAY, audit)
                now[0] += 6 * DAY
                assert retention.sweep() == 0  # nothing is older than 7 days yet
                clock.read(blocks["ds", "v2"])  # v2 is read on day 6; v1 never
                now[0] += 2 * DAY
                assert retention.sweep() == len(v1_only)
                assert not any(cache.contains(d) for d in v1_only)
                assert all(cache.contains(d) for d in shared | set(blocks["ds", "v2"]))
                assert all(cache.contains(d) for d in blocks["pinned", "v1"])  # pinned stays
                assert retention.sweep() == 0
                records = [
                    json.loads(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines()
                ]
                assert [(r["who"], r["outcome"]) for r in records] == [
                    ("daemon", f"{len(v1_only)} blocks dropped")
                ]
                assert records[0]["what"].startswith("retention evict ds snapshot ")
            finally:
                await scheduler.close()
                await hub.close()
                audit.close()
        env.close()

    asyncio.run(main())


def test_the_read_clock_survives_a_restart(tmp_path: Path) -> None:
    layout = CacheLayout(tmp_path)
    env = open_index(layout)
    now = [1000.0]
    clock = ReadClock(lambda: now[0], env)
    clock.read(["a" * 32, "b" * 32])
    now[0] = 2000.0
    clock.read(["b" * 32])
    assert clock.flush() == 2 and clock.flush() == 0
    clock.read(["c" * 32])  # read after the last flush: lost by an unclean stop
    now[0] = 5000.0
    again = ReadClock(lambda: now[0], env)  # the daemon restarted
    assert again.last("a" * 32) == 1000.0 and again.last("b" * 32) == 2000.0
    assert again.last("c" * 32) == 5000.0  # unstamped: the restart, never sooner
    assert again.prune(lambda d: d != "a" * 32) == 1
    assert again.flush() == 1
    assert ReadClock(lambda: now[0], env).last("a" * 32) == 5000.0
    env.close()


@pytest.mark.parametrize("text", ["7", "7x", "0d", "", "1d 2h"])
def test_bad_retention(text: str) -> None:
    with pytest.raises(ValueError, match="--retention"):
        parse_duration(text)


def test_retention_units() -> None:
    assert parse_duration("1d12h") == 1.5 * DAY
    assert parse_duration("90s") == 90
