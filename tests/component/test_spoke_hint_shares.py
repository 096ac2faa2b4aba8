"""Scoped admin tokens' shares of the node's hint totals, through the real admin app over a
real hub: one team's hint streams hold at most a quarter of the planned reads
(``MAX_TOTAL_POSITIONS``) and of the distinct blocks (``MAX_TOTAL_BLOCKS``) on its datasets,
the last eighth of each is the node-wide token's, a refusal is a 400 naming the share, and
what a team's streams hold is free again once they are deleted, replaced or expire (issue
39's ninth probe: team-a's 4 streams of 4 million planned reads filled the node's 16
million, and team-b's one-file hint was refused ``total_positions`` every time)."""

from __future__ import annotations

import asyncio
import hashlib
import random
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
from spoke.disk.layout import CacheLayout
from spoke.fetch.fetcher import Fetcher
from spoke.fetch.scheduler import FetchScheduler
from spoke.hublink.client import HubClient
from spoke.hublink.source import HubSource
from spoke.prefetch import hints as hintservice
from spoke.prefetch.hints import IDLE_S, HintService
from spoke.prefetch.prewarm import PrewarmJobs
from spoke.serve.admin import create_app
from spoke.serve.adminguard import AdminGuard
from spoke.serve.admintokens import ScopedTokens
from spoke.upkeep.pins import PinRegistry
from tests.integration.hub_support import write_tree

TOKEN = "hint-shares-operator-0123456789"
TEAM_A = "hint-shares-team-a-5f2c"
TEAM_B = "hint-shares-team-b-9e41"
OPERATOR = {"Authorization": f"Bearer {TOKEN}"}
A = {"Authorization": f"Bearer {TEAM_A}"}
B = {"Authorization": f"Bearer {TEAM_B}"}
BLOCK = 4096
FILES = 8  # f0..f7, four blocks each, no block like another's
PER_FILE = 4


@pytest.fixture(scope="module")
def hub_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    base = tmp_path_factory.mktemp("hintshareshub")
    for n, dataset in enumerate(("ds-a", "ds-b", "ds-o")):
        rng = random.Random(n)
        files = {f"f{i}": rng.randbytes(PER_FILE * BLOCK) for i in range(FILES)}
        publish(base / "data", dataset, write_tree(base / dataset, files), block_size=BLOCK)
    with ServerThread(base / "data") as hub:
        yield hub.port


class Clock:
    """A monotonic clock the test moves (streams expire after ``IDLE_S`` of it)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


Scenario = Callable[[httpx.AsyncClient, HintService, Clock], Awaitable[None]]


def run(tmp_path: Path, port: int, scenario: Scenario) -> None:
    scoped = tmp_path / "scoped.yaml"
    scoped.write_text(
        f"team-a:\n  sha256: {hashlib.sha256(TEAM_A.encode()).hexdigest()}\n"
        "  datasets: [ds-a]\n"
        f"team-b:\n  sha256: {hashlib.sha256(TEAM_B.encode()).hexdigest()}\n"
        "  datasets: [ds-b]\n"
    )

    async def main() -> None:
        layout = CacheLayout(tmp_path / "cache")
        layout.root.mkdir()
        env = open_index(layout)
        hub = HubClient(f"127.0.0.1:{port}")
        cache = BlockCache(
            BlockStore(layout, env), HintedPolicy(make_policy("lru", 1 << 24)), 1 << 24
        )
        catalog = SnapshotCatalog(hub, env)
        scheduler = FetchScheduler(Fetcher(HubSource(hub), miss_deadline=5), cache)
        pins = PinRegistry(env, cache)
        jobs = PrewarmJobs(catalog, cache, scheduler, pins)
        clock = Clock()
        hints = HintService(cache, scheduler, clock=clock)
        app = create_app(cache, scheduler, catalog, jobs, pins, hints=hints)
        guarded = AdminGuard(app, TOKEN, scoped=ScopedTokens(scoped))
        transport = httpx.ASGITransport(app=guarded)  # type: ignore[arg-type]
        try:
            async with httpx.AsyncClient(
                transport=transport, base_url="http://spoke", timeout=60
            ) as client:
                await scenario(client, hints, clock)
        finally:
            await jobs.close()
            await scheduler.close()
            await hub.close()
            env.close()

    asyncio.run(main())


def hint(dataset: str, stream: str, files: list[int]) -> dict[str, object]:
    return {"dataset": dataset, "stream": stream, "paths": [f"f{i}" for i in files]}


async def post(
    client: httpx.AsyncClient, headers: dict[str, str], body: dict[str, object]
) -> httpx.Response:
    return await client.post("/v1/hints", json=body, headers=headers)


async def accepted(
    client: httpx.AsyncClient, headers: dict[str, str], body: dict[str, object]
) -> None:
    reply = await post(client, headers, body)
    assert reply.status_code == 202, reply.text


async def refused(
    client: httpx.AsyncClient,
    headers: dict[str, str],
    body: dict[str, object],
    limit: str,
    value: int,
) -> str:
    """Posts ``body``, expects a 400 naming ``limit`` and ``value`` with nothing changed;
    returns the refusal's detail."""
    before = (await client.get("/v1/hints", headers=OPERATOR)).json()
    reply = await post(client, headers, body)
    assert reply.status_code == 400, reply.text
    answer = reply.json()
    assert (answer["limit"], answer["value"]) == (limit, value), answer
    assert f"{value:,}" in answer["detail"]
    after = (await client.get("/v1/hints", headers=OPERATOR)).json()
    assert [s["stream"] for s in after] == [s["stream"] for s in before]
    assert [s["hint_length"] for s in after] == [s["hint_length"] for s in before]
    return str(answer["detail"])


def owned_by(dataset: str) -> Callable[[str], bool]:
    return lambda source: source.startswith(f"{dataset}@")


def test_a_team_filling_its_share_of_planned_reads_leaves_the_rest_to_others(
    tmp_path: Path, hub_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """64 planned reads on the node: team-a's streams may hold 16 (a quarter), whichever
    streams they are in; past it team-a is refused ``tenant_positions`` while team-b and
    the operator are still served. Deleting, replacing and expiring team-a's streams gives
    its share back, counted from what its installed plans hold."""
    monkeypatch.setattr(hintservice, "MAX_TOTAL_POSITIONS", 64)

    async def scenario(client: httpx.AsyncClient, hints: HintService, clock: Clock) -> None:
        await accepted(client, A, hint("ds-a", "a0", [0, 1, 2]))  # 12 planned reads
        detail = await refused(client, A, hint("ds-a", "a1", [3, 4]), "tenant_positions", 16)
        assert "admin token 'team-a'" in detail and "1/4 of 64" in detail
        assert "planned reads" in detail
        await accepted(client, A, hint("ds-a", "a1", [3]))  # 16: the whole share
        await refused(client, A, hint("ds-a", "a2", [0]), "tenant_positions", 16)
        assert hints.held(owned_by("ds-a"))[0] == 16

        await accepted(client, B, hint("ds-b", "b0", [0, 1, 2, 3]))  # team-b: its 16
        await accepted(client, OPERATOR, hint("ds-o", "o0", [0, 1]))
        await refused(client, B, hint("ds-b", "b1", [0]), "tenant_positions", 16)
        assert hints.held(owned_by("ds-b"))[0] == 16 and hints.held()[0] == 40

        # a stream posted again replaces its plan: it is not counted twice
        await accepted(client, A, hint("ds-a", "a1", [4]))
        assert (await client.delete("/v1/hints/a0", headers=A)).status_code == 200
        assert hints.held(owned_by("ds-a"))[0] == 4  # a0's 12 are free again
        await accepted(client, A, hint("ds-a", "a2", [5, 6, 7]))
        await refused(client, A, hint("ds-a", "a3", [0]), "tenant_positions", 16)

        clock.now += IDLE_S  # nobody read or posted: every stream expires
        assert hints.held(owned_by("ds-a")) == (0, 0) and hints.held() == (0, 0)
        await accepted(client, A, hint("ds-a", "a0", [0, 1, 2, 3]))
        assert hints.held(owned_by("ds-a"))[0] == 16

    run(tmp_path, hub_port, scenario)


def test_the_last_eighth_of_planned_reads_is_the_operators(
    tmp_path: Path, hub_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With 40 of 64 planned reads the operator's, scoped tokens together stop at 56 (the
    last 8 are kept: ``reserve_positions``), each within its own share; the operator
    still takes the reserve, then the node's total is the limit for it too."""
    monkeypatch.setattr(hintservice, "MAX_TOTAL_POSITIONS", 64)

    async def scenario(client: httpx.AsyncClient, hints: HintService, clock: Clock) -> None:
        await accepted(client, OPERATOR, hint("ds-o", "o0", list(range(8))))  # 32
        await accepted(client, OPERATOR, hint("ds-o", "o1", [0, 1]))  # 40
        await accepted(client, A, hint("ds-a", "a0", [0, 1, 2]))  # 52
        detail = await refused(client, B, hint("ds-b", "b0", [0, 1]), "reserve_positions", 56)
        assert "the last 8 of 64 are kept for the node's admin token" in detail
        await accepted(client, B, hint("ds-b", "b0", [0]))  # 56
        await refused(client, A, hint("ds-a", "a1", [0]), "reserve_positions", 56)
        await accepted(client, OPERATOR, hint("ds-o", "o2", [0, 1]))  # 64: the reserve
        await refused(client, OPERATOR, hint("ds-o", "o3", [0]), "total_positions", 64)

    run(tmp_path, hub_port, scenario)


def test_a_team_holds_its_share_of_distinct_blocks(
    tmp_path: Path, hub_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """32 distinct blocks on the node (summed per stream): team-a's streams hold at most 8,
    a block two of its streams plan counting in each; team-b and the operator are still
    served, and ``reserve_blocks`` keeps the last 4 for the operator."""
    monkeypatch.setattr(hintservice, "MAX_TOTAL_BLOCKS", 32)

    async def scenario(client: httpx.AsyncClient, hints: HintService, clock: Clock) -> None:
        await accepted(client, A, hint("ds-a", "a0", [0, 0, 1, 1]))  # 8 distinct blocks
        detail = await refused(client, A, hint("ds-a", "a1", [0]), "tenant_blocks", 8)
        assert "admin token 'team-a'" in detail and "distinct blocks" in detail
        assert hints.held(owned_by("ds-a")) == (16, 8)
        await accepted(client, B, hint("ds-b", "b0", [0]))  # 4
        await accepted(client, OPERATOR, hint("ds-o", "o0", [0, 1, 2, 3]))  # 28 of 32
        await refused(client, B, hint("ds-b", "b1", [1]), "reserve_blocks", 28)
        await accepted(client, OPERATOR, hint("ds-o", "o1", [4]))  # 32: the reserve
        assert (await client.delete("/v1/hints/a0", headers=A)).status_code == 200
        assert hints.held(owned_by("ds-a")) == (0, 0)
        await accepted(client, A, hint("ds-a", "a1", [2]))  # team-a's share is back

    run(tmp_path, hub_port, scenario)
