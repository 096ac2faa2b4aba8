"""The admin API in-process (httpx.ASGITransport over the guarded app): token checked before
any body is read, bodies capped (413 JSON) and bodies in flight (503 JSON), caps on pins
and running jobs (429), /docs with no CDN, pins going with a revoked version, and an audit
record for each action and refused token. What a scoped admin token may do is in
``test_spoke_admin_scoped.py``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from spoke.cache.blockcache import BlockCache
from spoke.cache.registry import make_policy
from spoke.cache.store import BlockStore, open_index
from spoke.catalog.catalog import SnapshotCatalog
from spoke.disk.layout import CacheLayout
from spoke.fetch.fetcher import Fetcher
from spoke.fetch.scheduler import FetchScheduler
from spoke.hublink.client import HubClient
from spoke.hublink.source import HubSource
from spoke.prefetch.prewarm import PrewarmJobs
from spoke.serve import admin as admin_module
from spoke.serve.adminguard import MAX_BODY_BYTES, AdminGuard
from spoke.upkeep.pins import PinRegistry
from tests.component.spoke_admin_support import (
    AUTH,
    TOKEN,
    audit_lines,
    hub_port_fixture,  # noqa: F401  (the hub_port fixture)
    run,
)


def test_token_is_checked_before_the_body_is_read(tmp_path: Path, hub_port: int) -> None:
    async def scenario(client: httpx.AsyncClient, audit: Path) -> None:
        read = 0

        async def body() -> AsyncIterator[bytes]:
            nonlocal read
            for _ in range(64):
                read += 1
                yield b"x" * 65536

        reply = await client.post("/v1/prewarm", content=body())
        assert reply.status_code == 401
        assert reply.json() == {"detail": "missing or wrong bearer token"}
        assert read <= 1, "an unauthenticated body must not be read"
        wrong = {"Authorization": "Bearer nope"}
        assert (await client.get("/v1/cache", headers=wrong)).status_code == 401
        assert (await client.get("/healthz")).status_code == 200  # probes stay open
        (first, second) = audit_lines(audit)
        assert first["what"] == "POST /v1/prewarm" and first["outcome"].startswith("denied")
        assert first["who"] == "127.0.0.1:4242"
        assert second["what"] == "GET /v1/cache"
        assert TOKEN not in audit.read_text() and "nope" not in audit.read_text()

    run(tmp_path, hub_port, scenario)


def test_bodies_are_capped_with_413_json(tmp_path: Path, hub_port: int) -> None:
    async def scenario(client: httpx.AsyncClient, audit: Path) -> None:
        declared = await client.post(
            "/v1/hints",
            headers={**AUTH, "Content-Length": str(100 << 20)},
            content=b"{}",  # what is declared is refused before anything is read
        )
        assert declared.status_code == 413
        assert declared.json()["detail"] == f"request body larger than {MAX_BODY_BYTES} bytes"
        sent = 0

        async def stream() -> AsyncIterator[bytes]:
            nonlocal sent
            for _ in range(200):  # 200 x 1 MiB, no Content-Length
                sent += 1
                yield b" " * (1 << 20)

        chunked = await client.post("/v1/hints", headers=AUTH, content=stream())
        assert chunked.status_code == 413
        assert sent <= MAX_BODY_BYTES // (1 << 20) + 2, "reading stops at the cap"
        outcomes = [line["outcome"] for line in audit_lines(audit)]
        assert outcomes == ["refused: body too large"] * 2

    run(tmp_path, hub_port, scenario)


def test_bodies_in_flight_are_capped_with_503_json(tmp_path: Path, hub_port: int) -> None:
    """However many connections send bodies slowly, the daemon takes in at most
    ``max_bodies`` of them at once, one token half (issue 39's re-probe: 250 slow 8 MiB
    hints of one scoped token took the daemon to 2,131 MiB)."""
    MiB = 1 << 20

    async def scenario(client: httpx.AsyncClient, audit: Path) -> None:
        go_on, taken = asyncio.Event(), asyncio.Event()

        async def slow() -> AsyncIterator[bytes]:
            yield b" " * (MiB + MiB // 2)
            taken.set()  # the daemon took the first part in and asks for more
            await go_on.wait()
            yield b" " * (MiB // 2)

        held = asyncio.ensure_future(
            client.post(
                "/v1/hints",
                headers={**AUTH, "Content-Length": str(2 * MiB)},
                content=slow(),
            )
        )
        await asyncio.wait_for(taken.wait(), 30)  # the first body is being received
        busy = await client.post(
            "/v1/hints", headers={**AUTH, "Content-Length": str(MiB)}, content=b" " * MiB
        )
        assert busy.status_code == 503
        assert busy.headers["retry-after"] == "1"
        assert "at most 4194304 at once, half for one token" in busy.json()["detail"]
        assert not held.done()
        go_on.set()
        assert (await held).status_code == 422  # received whole (blanks are no JSON)
        after = await client.post(
            "/v1/hints", headers={**AUTH, "Content-Length": str(MiB)}, content=b" " * MiB
        )
        assert after.status_code == 422  # room again once the first was answered
        outcomes = [line["outcome"] for line in audit_lines(audit)]
        assert outcomes.count("refused: bodies in flight") == 1

    run(tmp_path, hub_port, scenario, max_bodies=4 * MiB)


def test_body_bytes_are_charged_as_they_arrive_whatever_the_headers_say() -> None:
    """``Content-Length: 0`` with chunked encoding (which h11 reads as chunked) once
    slipped past a charge of the declared length; bytes are charged as they arrive, and
    connections that send headers only hold nothing."""
    MiB = 1 << 20
    got: list[int] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        total = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise RuntimeError("the client went away")  # what a framework raises
            total += len(message.get("body", b""))
            if not message.get("more_body"):
                break
        got.append(total)
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def main() -> list[Any]:
        guard = AdminGuard(app, TOKEN, max_bodies=4 * MiB)  # half, 2 MiB, for one token
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        chunks = [{"type": "http.request", "body": b" " * MiB, "more_body": True}] * 3
        chunks.append({"type": "http.request", "body": b"", "more_body": False})
        feed = iter(chunks)

        async def receive() -> dict[str, Any]:
            return next(feed)

        scope = {
            "type": "http",
            "method": "POST",
            "path": "/v1/hints",
            "client": ("127.0.0.1", 4242),
            "headers": [
                (b"authorization", f"Bearer {TOKEN}".encode()),
                (b"content-length", b"0"),
                (b"transfer-encoding", b"chunked"),
            ],
        }
        await guard(scope, receive, send)
        assert guard.bodies == 0  # given back once answered
        return sent

    sent = asyncio.run(main())
    assert got == []  # the app never had the body
    assert sent[0]["status"] == 503
    assert b"half for one token" in sent[1]["body"]


def test_pin_and_job_caps(tmp_path: Path, hub_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admin_module, "MAX_PINS", 3)
    monkeypatch.setattr(admin_module, "MAX_RUNNING_JOBS", 0)

    async def scenario(client: httpx.AsyncClient, audit: Path) -> None:
        for i in range(3):
            body = {"dataset": "ds", "paths": [f"f{i}.bin"]}
            reply = await client.post("/v1/pins", json=body, headers=AUTH)
            assert reply.status_code == 201, reply.text
        refused = await client.post("/v1/pins", json={"dataset": "ds"}, headers=AUTH)
        assert refused.status_code == 429
        assert refused.json()["detail"] == "3 pins exist; remove some (DELETE /v1/pins/ID)"
        job = await client.post("/v1/prewarm", json={"dataset": "ds"}, headers=AUTH)
        assert job.status_code == 429
        assert "prewarm jobs are running (at most 0)" in job.json()["detail"]
        records = audit_lines(audit)
        assert [(r["what"], r["outcome"]) for r in records] == [
            ("POST /v1/pins", "201"),
            ("POST /v1/pins", "201"),
            ("POST /v1/pins", "201"),
            ("POST /v1/pins", "429"),
            ("POST /v1/prewarm", "429"),
        ]
        assert records[0]["dataset"] == "ds" and records[0]["paths"] == 1

    run(tmp_path, hub_port, scenario)


def test_docs_work_offline(tmp_path: Path, hub_port: int) -> None:
    async def scenario(client: httpx.AsyncClient, audit: Path) -> None:
        page = await client.get("/docs")
        assert page.status_code == 200
        assert "<script" not in page.text and "http" not in page.text.replace("/openapi.json", "")
        for route in ("POST /v1/prewarm", "POST /v1/pins", "POST /v1/evict", "GET /readyz"):
            assert route in page.text, route
        assert "PrewarmRequest" in page.text or '"dataset"' in page.text

    run(tmp_path, hub_port, scenario)


def test_pins_of_a_revoked_version_go_with_it(tmp_path: Path, hub_port: int) -> None:
    from protocol.hub.v1 import hub_pb2
    from spoke.upkeep.invalidation import Invalidator

    async def main() -> None:
        layout = CacheLayout(tmp_path / "cache")
        layout.root.mkdir()
        env = open_index(layout)
        hub = HubClient(f"127.0.0.1:{hub_port}")
        cache = BlockCache(BlockStore(layout, env), make_policy("lru", 1 << 24), 1 << 24)
        catalog = SnapshotCatalog(hub, env)
        scheduler = FetchScheduler(Fetcher(HubSource(hub), miss_deadline=5), cache)
        pins = PinRegistry(env, cache)
        jobs = PrewarmJobs(catalog, cache, scheduler, pins)
        try:
            snapshot, globs, _, blocks = await jobs.resolve("ds", "v1", [])
            kept = pins.add("other", "v1", "v1", [], {})
            pin = pins.add("ds", "v1", snapshot.version, globs, blocks)
            assert all(cache.is_pinned(d) for d in blocks)
            event = hub_pb2.CatalogEvent(
                sequence=7,
                kind=hub_pb2.EVENT_KIND_VERSION_REVOKED,
                dataset="ds",
                version="v1",
                snapshot_id=snapshot.snapshot_id,
            )
            await Invalidator(hub, catalog, cache, pins).apply(event)
            assert pins.get(pin.id) is None and pins.get(kept.id) is not None
            assert not any(cache.is_pinned(d) for d in blocks)
            assert [p.id for p in PinRegistry(env, cache).all()] == [kept.id]  # persisted
        finally:
            await jobs.close()
            await scheduler.close()
            await hub.close()
            env.close()

    asyncio.run(main())


def test_an_invalid_body_is_answered_in_a_few_errors_whatever_its_size(
    tmp_path: Path, hub_port: int
) -> None:
    """Issue 39's seventeenth probe: a million empty hint paths made a 140 MB 422 and
    2.3 GiB of daemon. A list stops at its first bad item, and a 422 lists at most
    ERRORS_SHOWN errors, never quoting the input."""

    async def scenario(client: httpx.AsyncClient, audit: Path) -> None:
        empty = {"dataset": "ds", "paths": [""] * 1_000_000}
        hints = await client.post("/v1/hints", headers=AUTH, json=empty)
        assert hints.status_code == 422 and len(hints.content) < 1000
        assert [e["loc"] for e in hints.json()["detail"]] == [["body", "paths", 0]]
        numbers = await client.post(
            "/v1/prewarm", headers=AUTH, json={"dataset": "ds", "globs": [7] * 9000}
        )
        assert numbers.status_code == 422 and len(numbers.json()["detail"]) == 1
        extra = {"dataset": "ds", **{f"x{i}": "y" * 50 for i in range(5000)}}
        unknown = await client.post("/v1/prewarm", headers=AUTH, json=extra)
        body = unknown.json()
        assert unknown.status_code == 422 and body["errors"] == 5000
        assert len(body["detail"]) == admin_module.ERRORS_SHOWN
        assert "y" * 50 not in unknown.text  # the input is not quoted back

    run(tmp_path, hub_port, scenario)
