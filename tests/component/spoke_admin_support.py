"""What the admin API's in-process tests (``tests/component/test_spoke_admin*.py``) share: a
hub serving the datasets ``ds`` and ``other`` (the ``hub_port`` fixture; import
``hub_port_fixture`` to use it), the node-wide admin token, :func:`run` to play a scenario
against a spoke's guarded admin app over ``httpx.ASGITransport``, and the audit log's
records (:func:`audit_lines`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hub.publish.tree import publish
from hub.serve.serverthread import ServerThread
from spoke.audit import AuditLog
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
from spoke.prefetch.hints import HintService
from spoke.prefetch.prewarm import PrewarmJobs
from spoke.serve.admin import create_app
from spoke.serve.adminguard import MAX_BODIES_BYTES, AdminGuard
from spoke.serve.admintokens import ScopedTokens
from spoke.upkeep.pins import PinRegistry
from tests.integration.hub_support import write_tree

TOKEN = "admin-secret-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module", name="hub_port")
def hub_port_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    base = tmp_path_factory.mktemp("adminhub")
    files = {f"f{i}.bin": bytes([i]) * 1000 for i in range(5)}
    publish(base / "data", "ds", write_tree(base / "src", files))
    publish(base / "data", "other", write_tree(base / "other", files))
    with ServerThread(base / "data") as hub:
        yield hub.port


Scenario = Callable[[httpx.AsyncClient, Path], Awaitable[None]]


def run(
    tmp_path: Path,
    port: int,
    scenario: Scenario,
    scoped: ScopedTokens | None = None,
    hinted: bool = False,
    max_bodies: int = MAX_BODIES_BYTES,
) -> None:
    async def main() -> None:
        layout = CacheLayout(tmp_path / "cache")
        layout.root.mkdir()
        env = open_index(layout)
        hub = HubClient(f"127.0.0.1:{port}")
        policy = make_policy("lru", 1 << 24)
        if hinted:
            policy = HintedPolicy(policy)
        cache = BlockCache(BlockStore(layout, env), policy, 1 << 24)
        catalog = SnapshotCatalog(hub, env)
        scheduler = FetchScheduler(Fetcher(HubSource(hub), miss_deadline=5), cache)
        pins = PinRegistry(env, cache)
        jobs = PrewarmJobs(catalog, cache, scheduler, pins)
        audit = AuditLog(tmp_path / "audit.jsonl")
        hints = HintService(cache, scheduler) if hinted else None
        app = AdminGuard(
            create_app(cache, scheduler, catalog, jobs, pins, hints=hints),
            TOKEN,
            audit,
            scoped=scoped,
            max_bodies=max_bodies,
        )
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 4242))  # type: ignore[arg-type]
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://spoke") as client:
                await scenario(client, tmp_path / "audit.jsonl")
        finally:
            await jobs.close()
            await scheduler.close()
            await hub.close()
            audit.close()
            env.close()

    asyncio.run(main())


def audit_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]
