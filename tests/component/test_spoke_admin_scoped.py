"""Scoped admin tokens in-process (httpx.ASGITransport over the guarded app): a team's token
acts only on its datasets and sees only its own jobs and pins, holds at most its share of
pins and hint streams while the node-wide token keeps a reserve, and cannot take over
another team's hint stream; tokens never reach the audit log."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import httpx
import pytest

from spoke.catalog.catalog import SnapshotCatalog
from spoke.serve import admin as admin_module
from spoke.serve.admintokens import ScopedTokens
from spoke.serve.routes import context as route_context
from spoke.serve.routes import hints as hint_routes
from tests.component.spoke_admin_support import (
    AUTH,
    audit_lines,
    hub_port_fixture,  # noqa: F401  (the hub_port fixture)
    run,
)

TEAM_A = "team-a-admin-token-5f2c"
TEAM_B = "team-b-admin-token-9e41"


def _scoped(tmp_path: Path) -> ScopedTokens:
    path = tmp_path / "scoped.yaml"
    path.write_text(
        f"team-a:\n  sha256: {hashlib.sha256(TEAM_A.encode()).hexdigest()}\n"
        "  datasets: [ds]\n"
        f"team-b:\n  sha256: {hashlib.sha256(TEAM_B.encode()).hexdigest()}\n"
        "  datasets: [other, 'other-*']\n"
    )
    return ScopedTokens(path)


async def _first_done(posts: list[asyncio.Task[httpx.Response]], n: int) -> list[httpx.Response]:
    """The answers of the first ``n`` of ``posts`` to end (within 30 s)."""
    async with asyncio.timeout(30):
        while len([t for t in posts if t.done()]) < n:
            await asyncio.sleep(0.01)
    return [t.result() for t in posts if t.done()]


def test_a_scoped_admin_token_acts_only_on_its_datasets(tmp_path: Path, hub_port: int) -> None:
    """team-a's token prewarms and pins ds and sees its jobs and pins; team-b's gets 403 on
    ds, sees none of team-a's jobs or pins (404 by id), and neither may read the node's
    cache status or evict; the node-wide token still may."""

    async def scenario(client: httpx.AsyncClient, audit: Path) -> None:
        a = {"Authorization": f"Bearer {TEAM_A}"}
        b = {"Authorization": f"Bearer {TEAM_B}"}
        job = await client.post("/v1/prewarm", json={"dataset": "ds"}, headers=a)
        assert job.status_code == 202, job.text
        pin = await client.post("/v1/pins", json={"dataset": "ds"}, headers=a)
        assert pin.status_code == 201, pin.text
        for method, path, body in (
            ("POST", "/v1/prewarm", {"dataset": "ds"}),
            ("POST", "/v1/pins", {"dataset": "ds"}),
            ("POST", "/v1/hints", {"dataset": "ds", "stream": "s", "paths": ["f0.bin"]}),
        ):
            refused = await client.request(method, path, json=body, headers=b)
            assert refused.status_code == 403, (path, refused.text)
            assert "'team-b' may not act on dataset 'ds'" in refused.json()["detail"]
        job_id, pin_id = job.json()["id"], pin.json()["id"]
        assert [j["id"] for j in (await client.get("/v1/jobs", headers=a)).json()] == [job_id]
        assert (await client.get("/v1/jobs", headers=b)).json() == []
        assert (await client.get("/v1/pins", headers=b)).json() == []
        assert (await client.get(f"/v1/jobs/{job_id}", headers=b)).status_code == 404
        assert (await client.delete(f"/v1/jobs/{job_id}", headers=b)).status_code == 404
        assert (await client.delete(f"/v1/pins/{pin_id}", headers=b)).status_code == 404
        for token in (a, b):
            assert (await client.get("/v1/cache", headers=token)).status_code == 403
            evicted = await client.post("/v1/evict", json={"all": True}, headers=token)
            assert evicted.status_code == 403
        assert (await client.get("/v1/cache", headers=AUTH)).status_code == 200
        assert (await client.delete(f"/v1/pins/{pin_id}", headers=a)).status_code == 200
        assert (
            await client.get("/v1/cache", headers={"Authorization": "Bearer x"})
        ).status_code == 401
        records = audit_lines(audit)
        assert any(r["who"].endswith("(team-b)") and r["outcome"] == "403" for r in records)
        assert TEAM_A not in audit.read_text() and TEAM_B not in audit.read_text()

    run(tmp_path, hub_port, scenario, scoped=_scoped(tmp_path))


def test_a_scoped_token_holds_its_share_of_pins_and_the_operator_keeps_a_reserve(
    tmp_path: Path, hub_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One team's token cannot use up the spoke's pins (issue 39's fifth probe: team-a's
    999 pins refused every pin and pinned prewarm of team-b): a scoped token holds at most
    a quarter on its datasets, and the last eighth is the node-wide token's."""
    monkeypatch.setattr(admin_module, "MAX_PINS", 4)  # a scoped share of 1, a reserve of 1

    async def scenario(client: httpx.AsyncClient, audit: Path) -> None:
        a = {"Authorization": f"Bearer {TEAM_A}"}
        b = {"Authorization": f"Bearer {TEAM_B}"}
        for headers, dataset in ((a, "ds"), (b, "other")):
            pin = await client.post("/v1/pins", json={"dataset": dataset}, headers=headers)
            assert pin.status_code == 201, pin.text
        for headers, dataset, who in ((a, "ds", "team-a"), (b, "other", "team-b")):
            for path, body in (
                ("/v1/pins", {"dataset": dataset}),
                ("/v1/prewarm", {"dataset": dataset, "pin": True}),
            ):
                refused = await client.post(path, json=body, headers=headers)
                assert refused.status_code == 429, refused.text
                assert f"admin token '{who}' holds 1 pins" in refused.json()["detail"]
        for _ in range(2):  # the operator takes the rest, the reserve included
            pin = await client.post("/v1/pins", json={"dataset": "ds"}, headers=AUTH)
            assert pin.status_code == 201, pin.text
        full = await client.post("/v1/pins", json={"dataset": "ds"}, headers=AUTH)
        assert full.status_code == 429
        assert full.json()["detail"] == "4 pins exist; remove some (DELETE /v1/pins/ID)"

    run(tmp_path, hub_port, scenario, scoped=_scoped(tmp_path))


def test_the_operators_reserve_is_kept_from_scoped_tokens(
    tmp_path: Path, hub_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admin_module, "MAX_PINS", 2)  # a share of 1 each, a reserve of 1

    async def scenario(client: httpx.AsyncClient, audit: Path) -> None:
        a = {"Authorization": f"Bearer {TEAM_A}"}
        b = {"Authorization": f"Bearer {TEAM_B}"}
        pin = await client.post("/v1/pins", json={"dataset": "ds"}, headers=a)
        assert pin.status_code == 201, pin.text
        refused = await client.post("/v1/pins", json={"dataset": "other"}, headers=b)
        assert refused.status_code == 429
        assert "the last 1 of 2 are kept for the node's admin token" in refused.json()["detail"]
        pin = await client.post("/v1/pins", json={"dataset": "other"}, headers=AUTH)
        assert pin.status_code == 201, pin.text

    run(tmp_path, hub_port, scenario, scoped=_scoped(tmp_path))


def test_a_scoped_token_holds_its_share_of_hint_streams(
    tmp_path: Path, hub_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One team's token cannot install every hint stream (the sixth probe: team-a's 64
    streams refused team-b's with 400): a scoped token holds a quarter on its datasets."""
    monkeypatch.setattr(hint_routes, "MAX_STREAMS", 8)  # a share of 2, a reserve of 1

    async def scenario(client: httpx.AsyncClient, audit: Path) -> None:
        a = {"Authorization": f"Bearer {TEAM_A}"}
        b = {"Authorization": f"Bearer {TEAM_B}"}

        def hint(dataset: str, stream: str) -> dict[str, object]:
            return {"dataset": dataset, "stream": stream, "paths": ["f0.bin"]}

        for stream in ("a0", "a1"):
            posted = await client.post("/v1/hints", json=hint("ds", stream), headers=a)
            assert posted.status_code == 202, posted.text
        refused = await client.post("/v1/hints", json=hint("ds", "a2"), headers=a)
        assert refused.status_code == 429, refused.text
        assert "'team-a' holds 2 hint streams" in refused.json()["detail"]
        again = await client.post("/v1/hints", json=hint("ds", "a1"), headers=a)
        assert again.status_code == 202, again.text  # its own stream, posted again
        posted = await client.post("/v1/hints", json=hint("other", "b0"), headers=b)
        assert posted.status_code == 202, posted.text

    run(tmp_path, hub_port, scenario, scoped=_scoped(tmp_path), hinted=True)


def test_a_scoped_token_cannot_take_over_another_teams_hint_stream(
    tmp_path: Path, hub_port: int
) -> None:
    """Each scoped token names its own streams: team-b's posts to "rank0", replacing or
    extending, at the same time as team-a's or after, land in team-b's "rank0", never in
    team-a's (the thirteenth probe's concurrent appends raced the ownership check into
    team-a's stream in 4 of 6 runs, locking team-a out of it); neither learns of the
    other's; the operator sees both, by their installed names."""

    async def scenario(client: httpx.AsyncClient, audit: Path) -> None:
        a = {"Authorization": f"Bearer {TEAM_A}"}
        b = {"Authorization": f"Bearer {TEAM_B}"}
        mine = {"dataset": "ds", "stream": "rank0", "paths": ["f0.bin", "f1.bin"]}
        for append in (False, True, True):
            theirs = {"dataset": "other", "stream": "rank0", "paths": ["f0.bin"], "append": append}
            posted = await asyncio.gather(
                client.post("/v1/hints", json={**mine, "append": append}, headers=a),
                client.post("/v1/hints", json=theirs, headers=b),
            )
            assert [p.status_code for p in posted] == [202, 202], [p.text for p in posted]
            assert [p.json()["stream"] for p in posted] == ["rank0", "rank0"]
            assert [p.json()["source"] for p in posted] == ["ds@v1", "other@v1"]
        (stream,) = (await client.get("/v1/hints", headers=a)).json()
        assert stream["stream"] == "rank0" and stream["source"] == "ds@v1"
        assert stream["hint_length"] == 6  # its own three posts, nothing of team-b's
        (stream,) = (await client.get("/v1/hints", headers=b)).json()
        assert stream["stream"] == "rank0" and stream["source"] == "other@v1"
        every = (await client.get("/v1/hints", headers=AUTH)).json()
        assert sorted(s["stream"] for s in every) == ["team-a:rank0", "team-b:rank0"]
        assert (await client.delete("/v1/hints/rank0", headers=b)).status_code == 200
        (stream,) = (await client.get("/v1/hints", headers=a)).json()  # team-a's kept
        assert stream["source"] == "ds@v1"
        assert (await client.delete("/v1/hints/rank0", headers=b)).status_code == 404

    run(tmp_path, hub_port, scenario, scoped=_scoped(tmp_path), hinted=True)


def test_concurrent_requests_of_a_scoped_token_hold_no_more_than_its_share(
    tmp_path: Path, hub_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 39's ninth probe: the room was checked before the snapshot was resolved (an
    await) and the pin or job counted only after it, so 200 concurrent prewarms of one
    token all passed (203 running against a share of 4); now checked again just before."""
    monkeypatch.setattr(admin_module, "MAX_PINS", 16)  # a scoped share of 4
    monkeypatch.setattr(route_context, "RESOLVING_PER_TOKEN", 100)  # all 12 resolve at once

    async def scenario(client: httpx.AsyncClient, audit: Path) -> None:
        a = {"Authorization": f"Bearer {TEAM_A}"}
        pins = await asyncio.gather(
            *(client.post("/v1/pins", json={"dataset": "ds"}, headers=a) for _ in range(12))
        )
        assert sorted(p.status_code for p in pins) == [201] * 4 + [429] * 8
        mine = await client.get("/v1/pins", headers=a)
        assert len(mine.json()) == 4

    run(tmp_path, hub_port, scenario, scoped=_scoped(tmp_path))


def test_a_scoped_token_resolves_two_requests_at_once_and_another_team_is_not_queued(
    tmp_path: Path, hub_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tenth probe: a token's many concurrent pins and prewarms each matched globs
    against the manifest (on the event loop); now a scoped token has at most
    RESOLVING_PER_TOKEN of them resolving, the rest refused with 429 at once, and another
    team's request is served meanwhile."""
    monkeypatch.setattr(admin_module, "MAX_PINS", 1000)
    gate = asyncio.Event()
    real = admin_module.PrewarmJobs.resolve

    async def slow_resolve(
        self: object, dataset: str, ref: str, paths: list[str], caller: str = ""
    ) -> object:
        if dataset == "ds":  # team-a's requests wait here, resolving, until released
            await gate.wait()
        return await real(self, dataset, ref, paths, caller)  # type: ignore[arg-type]

    monkeypatch.setattr(admin_module.PrewarmJobs, "resolve", slow_resolve)

    async def scenario(client: httpx.AsyncClient, audit: Path) -> None:
        a = {"Authorization": f"Bearer {TEAM_A}"}
        b = {"Authorization": f"Bearer {TEAM_B}"}
        posts = [
            asyncio.create_task(client.post("/v1/pins", json={"dataset": "ds"}, headers=a))
            for _ in range(8)
        ]
        refused = await _first_done(posts, 6)  # six are refused at once, two wait at the gate
        assert [r.status_code for r in refused] == [429] * 6
        assert "at most 2 at once" in refused[0].json()["detail"]
        other = await client.post("/v1/pins", json={"dataset": "other"}, headers=b)
        assert other.status_code == 201, other.text  # not behind team-a's
        gate.set()
        rest = await asyncio.gather(*(t for t in posts if not t.done()))
        assert [r.status_code for r in rest] == [201, 201]

    run(tmp_path, hub_port, scenario, scoped=_scoped(tmp_path))


def test_a_scoped_tokens_hint_posts_resolve_two_at_once(
    tmp_path: Path, hub_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The twelfth probe: 48 concurrent hint posts of one token each decoded and held the
    whole manifest (2.6 GiB for a 100,000-file dataset); hint posts now resolve under the
    same per-token limit and selection slots as pins and prewarms."""
    gate = asyncio.Event()
    real = SnapshotCatalog.manifest

    async def slow_manifest(self: SnapshotCatalog, dataset: str, ref: str, *a: object) -> object:
        if dataset == "ds":  # team-a's posts wait here, resolving, until released
            await gate.wait()
        return await real(self, dataset, ref, *a)  # type: ignore[arg-type]

    monkeypatch.setattr(SnapshotCatalog, "manifest", slow_manifest)

    async def scenario(client: httpx.AsyncClient, audit: Path) -> None:
        a = {"Authorization": f"Bearer {TEAM_A}"}
        b = {"Authorization": f"Bearer {TEAM_B}"}
        posts = [
            asyncio.create_task(
                client.post(
                    "/v1/hints",
                    json={"dataset": "ds", "stream": f"a{i}", "paths": ["f0.bin"]},
                    headers=a,
                )
            )
            for i in range(6)
        ]
        refused = await _first_done(posts, 4)  # four are refused at once, two wait at the gate
        assert [r.status_code for r in refused] == [429] * 4
        other = await client.post(
            "/v1/hints", json={"dataset": "other", "stream": "b", "paths": ["f0.bin"]}, headers=b
        )
        assert other.status_code == 202, other.text  # the other slot, not behind team-a
        gate.set()
        rest = await asyncio.gather(*(t for t in posts if not t.done()))
        assert [r.status_code for r in rest] == [202, 202]

    run(tmp_path, hub_port, scenario, scoped=_scoped(tmp_path), hinted=True)


def test_the_admin_ports_metrics_take_the_node_token_only(tmp_path: Path, hub_port: int) -> None:
    """The security probe: ``/metrics`` on the admin port listed every team's usage
    (resident and admitted bytes, reads) to anyone, while a scoped token got 403 on
    ``/v1/cache``. Now no or a wrong token gets 401 as on ``/v1/``, a scoped one 403 naming
    the ``--metrics`` port, the node-wide one the page; the probes' paths stay open."""

    async def scenario(client: httpx.AsyncClient, audit: Path) -> None:
        for headers in ({}, {"Authorization": "Bearer x"}, {"Authorization": "Basic x"}):
            refused = await client.get("/metrics", headers=headers)
            assert refused.status_code == 401, (headers, refused.text)
            assert refused.json() == {"detail": "missing or wrong bearer token"}
            assert refused.headers["www-authenticate"] == "Bearer"
        for token in (TEAM_A, TEAM_B):
            scoped = await client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
            assert scoped.status_code == 403, scoped.text
            detail = scoped.json()["detail"]
            assert "needs the node's admin token" in detail and "--metrics" in detail
            assert "strata_spoke" not in scoped.text
        page = await client.get("/metrics", headers=AUTH)
        assert page.status_code == 200, page.text
        assert "strata_spoke_cache_used_bytes" in page.text
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.get("/readyz")).status_code in (200, 503)  # no token asked
        assert (await client.get("/docs")).status_code == 200
        records = [r for r in audit_lines(audit) if r["what"] == "GET /metrics"]
        outcomes = [(r["who"], r["outcome"]) for r in records]
        assert ("127.0.0.1:4242", "denied: missing or wrong token") in outcomes
        for name in ("team-a", "team-b"):
            assert (f"127.0.0.1:4242 ({name})", "denied: scoped token") in outcomes
        assert TEAM_A not in audit.read_text() and TEAM_B not in audit.read_text()

    run(tmp_path, hub_port, scenario, scoped=_scoped(tmp_path))


def test_a_scoped_token_holds_its_share_of_pinned_block_references(
    tmp_path: Path, hub_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same whole-dataset pin, again and again, adds no pinned bytes but a block list
    each (the thirteenth probe: one token's 250 pins of 100,000 files took a spoke to
    2.8 GiB, and again at restart): a token's pins hold at most its share of the node's
    block references (a quarter of 40: 10, two pins of ds's 5 blocks), pinned prewarms
    alike; the operator keeps the last eighth."""
    monkeypatch.setattr(admin_module, "MAX_PIN_BLOCKS", 40)

    async def scenario(client: httpx.AsyncClient, audit: Path) -> None:
        a = {"Authorization": f"Bearer {TEAM_A}"}
        for _ in range(2):
            pin = await client.post("/v1/pins", json={"dataset": "ds"}, headers=a)
            assert pin.status_code == 201, pin.text
            assert pin.json()["blocks"] == 5
        for path, body in (
            ("/v1/pins", {"dataset": "ds"}),
            ("/v1/prewarm", {"dataset": "ds", "pin": True}),
        ):
            refused = await client.post(path, json=body, headers=a)
            assert refused.status_code == 429, refused.text
            assert refused.json()["detail"] == (
                "admin token 'team-a' holds 10 pinned block references on its datasets and "
                "may hold at most 10 (5 more asked); remove some pins"
            )
        one = await client.post("/v1/pins", json={"dataset": "ds", "paths": ["f0.bin"]}, headers=a)
        assert one.status_code == 429  # one block more is past the share too
        for _ in range(6):  # the operator: 10 + 30 = 40, the reserve included
            pin = await client.post("/v1/pins", json={"dataset": "ds"}, headers=AUTH)
            assert pin.status_code == 201, pin.text
        full = await client.post("/v1/pins", json={"dataset": "ds"}, headers=AUTH)
        assert full.status_code == 429
        assert "would hold 45 pinned block references, of at most 40" in full.json()["detail"]
        pins = (await client.get("/v1/pins", headers=AUTH)).json()
        assert sum(p["blocks"] for p in pins) == 40
        for pin in pins[2:]:  # the operator's pins on ds count against team-a's share too
            assert (await client.delete(f"/v1/pins/{pin['id']}", headers=AUTH)).status_code == 200
        assert (await client.post("/v1/pins", json={"dataset": "ds"}, headers=a)).status_code == 429
        assert (await client.delete(f"/v1/pins/{pins[0]['id']}", headers=a)).status_code == 200
        again = await client.post("/v1/pins", json={"dataset": "ds"}, headers=a)
        assert again.status_code == 201, again.text

    run(tmp_path, hub_port, scenario, scoped=_scoped(tmp_path))
