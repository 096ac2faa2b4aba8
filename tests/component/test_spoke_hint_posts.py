"""``POST /v1/hints`` through the real admin app over a real hub: the body is parsed and the
plan built off the event loop (``/healthz`` answers meanwhile), a post past a memory cap is
a 400 naming the cap and its value with nothing installed, and a million-path post is kept
as a compact plan."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import httpx
import pytest

from hub.publish.tree import publish
from hub.serve.serverthread import ServerThread
from spoke.cache.blockcache import BlockCache
from spoke.cache.hinted import HintedPolicy
from spoke.cache.registry import make_policy
from spoke.cache.store import BlockStore, open_index
from spoke.catalog.catalog import SnapshotCatalog
from spoke.disk.layout import CacheLayout, block_digest
from spoke.fetch.fetcher import Fetcher
from spoke.fetch.scheduler import FetchScheduler
from spoke.hublink.client import HubClient
from spoke.hublink.source import HubSource
from spoke.prefetch import hints as hintservice
from spoke.prefetch.hints import HintService
from spoke.prefetch.prewarm import PrewarmJobs
from spoke.serve.admin import create_app
from spoke.serve.adminguard import AdminGuard
from spoke.serve.routes import hints as hint_routes
from spoke.upkeep.pins import PinRegistry
from tests.integration.hub_support import write_tree

TOKEN = "hint-posts-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BLOCK = 4096
FILES = 40  # f00..f39, file i has i % 4 + 1 blocks


@pytest.fixture(scope="module")
def hub_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    base = tmp_path_factory.mktemp("hinthub")
    files = {f"f{i:02d}": content(i) for i in range(FILES)}
    publish(base / "data", "ds", write_tree(base / "src", files), block_size=BLOCK)
    with ServerThread(base / "data") as hub:
        yield hub.port


Scenario = Callable[[httpx.AsyncClient, HintService], Awaitable[None]]


def run(tmp_path: Path, port: int, scenario: Scenario) -> None:
    async def main() -> None:
        layout = CacheLayout(tmp_path / "cache")
        layout.root.mkdir()
        env = open_index(layout)
        hub = HubClient(f"127.0.0.1:{port}")
        policy = HintedPolicy(make_policy("lru", 1 << 24))
        cache = BlockCache(BlockStore(layout, env), policy, 1 << 24)
        catalog = SnapshotCatalog(hub, env)
        scheduler = FetchScheduler(Fetcher(HubSource(hub), miss_deadline=5), cache)
        pins = PinRegistry(env, cache)
        jobs = PrewarmJobs(catalog, cache, scheduler, pins)
        hints = HintService(cache, scheduler)
        app = create_app(cache, scheduler, catalog, jobs, pins, hints=hints)
        transport = httpx.ASGITransport(app=AdminGuard(app, TOKEN))  # type: ignore[arg-type]
        try:
            async with httpx.AsyncClient(
                transport=transport, base_url="http://spoke", headers=AUTH, timeout=60
            ) as client:
                await scenario(client, hints)
        finally:
            await jobs.close()
            await scheduler.close()
            await hub.close()
            env.close()

    asyncio.run(main())


async def streams(client: httpx.AsyncClient) -> list[tuple[object, ...]]:
    listed = (await client.get("/v1/hints")).json()
    return [(s["stream"], s["hint_length"], s["cursor"], s["source"]) for s in listed]


def blocks_of(i: int) -> int:
    return i % 4 + 1


def hint(paths: list[int], stream: str = "r0", append: bool = False) -> dict[str, object]:
    return {
        "dataset": "ds",
        "paths": [f"f{i:02d}" for i in paths],
        "stream": stream,
        "append": append,
    }


@pytest.mark.parametrize(
    ("caps", "posts", "limit", "value"),
    [
        ({"MAX_STREAM_POSITIONS": 10}, [hint([3, 3, 3])], "stream_positions", 10),
        (
            {"MAX_STREAM_POSITIONS": 10},
            [hint([3, 3]), hint([2], append=True)],
            "stream_positions",
            10,
        ),
        ({"MAX_TOTAL_POSITIONS": 11}, [hint([3, 3], "a"), hint([3], "b")], "total_positions", 11),
        (
            {"MAX_TOTAL_BLOCKS": 30},
            [hint(list(range(8)), "a"), hint(list(range(8, 16)), "b")],
            "total_blocks",
            30,
        ),
        ({"MAX_STREAMS": 2}, [hint([0], "a"), hint([0], "b"), hint([0], "c")], "streams", 2),
        (
            {"MAX_STREAM_PLANS": 2},
            [hint([0]), hint([1], append=True), hint([2], append=True)],
            "stream_plans",
            2,
        ),
    ],
    ids=[
        "stream-positions",
        "append-past-stream",
        "total-positions",
        "total-blocks",
        "streams",
        "posts-per-stream",
    ],
)
def test_a_post_past_a_cap_is_a_400_naming_it(
    tmp_path: Path,
    hub_port: int,
    monkeypatch: pytest.MonkeyPatch,
    caps: dict[str, int],
    posts: list[dict[str, object]],
    limit: str,
    value: int,
) -> None:
    for name, cap in caps.items():
        monkeypatch.setattr(hintservice, name, cap)

    async def scenario(client: httpx.AsyncClient, hints: HintService) -> None:
        *accepted, refused = posts
        for body in accepted:
            reply = await client.post("/v1/hints", json=body)
            assert reply.status_code == 202, reply.text
        before = await streams(client)
        reply = await client.post("/v1/hints", json=refused)
        assert reply.status_code == 400, reply.text
        answer = reply.json()
        assert (answer["limit"], answer["value"]) == (limit, value)
        assert f"{value:,}" in answer["detail"]
        assert await streams(client) == before  # nothing changed

    run(tmp_path, hub_port, scenario)


def test_the_plan_is_built_off_the_loop_while_healthz_answers(
    tmp_path: Path, hub_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    building, released = threading.Event(), threading.Event()
    answered_while_building: list[bool] = []
    real = hint_routes.hint_plan

    def held(*args: object) -> object:
        building.set()
        # if this ran on the event loop, /healthz could not be answered until it returns
        answered_while_building.append(released.wait(30))
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(hint_routes, "hint_plan", held)

    async def scenario(client: httpx.AsyncClient, hints: HintService) -> None:
        post = asyncio.ensure_future(client.post("/v1/hints", json=hint([1, 2, 3])))
        assert await asyncio.to_thread(building.wait, 30)
        assert (await client.get("/healthz")).status_code == 200
        released.set()
        reply = await post
        assert reply.status_code == 202, reply.text
        assert reply.json()["hint_length"] == blocks_of(1) + blocks_of(2) + blocks_of(3)

    run(tmp_path, hub_port, scenario)
    assert answered_while_building == [True]


def test_a_million_path_post_becomes_a_compact_plan(tmp_path: Path, hub_port: int) -> None:
    order = [i * 7 % FILES for i in range(1_000_000)]

    async def scenario(client: httpx.AsyncClient, hints: HintService) -> None:
        body = hint(order, "big")
        reply = await client.post("/v1/hints", json=body)
        assert reply.status_code == 202, reply.text
        answer = reply.json()
        planned = sum(blocks_of(i) for i in order)
        assert answer["paths"] == len(order)
        assert answer["blocks"] == answer["hint_length"] == planned
        stream = hints.policy.stream("big")
        assert stream is not None
        assert stream.distinct_blocks() == sum(blocks_of(i) for i in range(FILES))
        assert stream.memory_bytes() < 9 * planned  # 8 bytes a planned read, and the digests
        # the plan reads the files' blocks in the order posted: f00, then f07
        first = [stream.digest_at(p) for p in range(blocks_of(order[0]) + blocks_of(order[1]))]
        assert first == file_digests(0) + file_digests(7)

    run(tmp_path, hub_port, scenario)


def content(i: int) -> bytes:
    """File ``f{i:02d}``: ``i % 4`` whole blocks and a tail, no block like another."""
    return random.Random(i).randbytes(BLOCK * (i % 4) + 100)


def file_digests(i: int) -> list[str]:
    data = content(i)
    return [block_digest(data[at : at + BLOCK]) for at in range(0, len(data), BLOCK)]
