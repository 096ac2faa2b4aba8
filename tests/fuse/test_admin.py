"""The spoke's admin API against a real hub and spoke: prewarm jobs, pins, evict, auth and
bad input."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploy.local import LocalStack, stop_process
from tests.support import eventually, publish, requires_fuse

pytestmark = [pytest.mark.fuse, requires_fuse]

BLOCK = 65_536
TOKEN = "s3cr3t-admin-token"


@dataclass
class Spoke:
    stack: LocalStack
    hub: str
    admin: str
    tmp: Path
    token_file: Path

    def client(self, token: str | None = TOKEN) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.admin, headers=headers, timeout=30)


@pytest.fixture
def spoke(tmp_path: Path) -> Iterator[Spoke]:
    """A fresh hub and spoke, for a test that fetches, pins, evicts or restarts."""
    with _spoke(tmp_path) as s:
        yield s


@pytest.fixture(scope="module")
def idle_spoke(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Spoke]:
    """One hub and spoke for the tests whose calls are all refused: each checks that no
    job started and nothing was fetched, so sharing it only adds the earlier refusals to
    what each must find unchanged."""
    with _spoke(tmp_path_factory.mktemp("idle")) as s:
        yield s


@contextlib.contextmanager
def _spoke(tmp_path: Path) -> Iterator[Spoke]:
    src = tmp_path / "src"
    (src / "train").mkdir(parents=True)
    (src / "val").mkdir()
    for i in range(6):
        (src / "train" / f"t{i}.bin").write_bytes(os.urandom(4 * BLOCK))
    (src / "val" / "v.bin").write_bytes(os.urandom(2 * BLOCK))
    publish(tmp_path / "hub", "ds", src, "--block-size", str(BLOCK))
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    with LocalStack() as stack:
        hub = stack.start_hub(tmp_path / "hub")
        admin = stack.start_spoke(
            hub,
            tmp_path / "cache",
            tmp_path / "mnt",
            "1MiB",
            extra=("--admin-token-file", str(token_file)),
        )
        yield Spoke(stack, hub, admin, tmp_path, token_file)


def _wait(client: httpx.Client, job: dict[str, Any]) -> dict[str, Any]:
    if job["state"] != "running":
        return job
    return eventually(
        lambda: (now := client.get(f"/v1/jobs/{job['id']}").json())["state"] != "running" and now,
        f"job {job['id']} ended",
        60,
    )


def test_prewarm_job_runs_to_done_and_counts_bytes(spoke: Spoke) -> None:
    with spoke.client() as c:
        reply = c.post("/v1/prewarm", json={"dataset": "ds", "ref": "v1", "paths": ["val/*"]})
        assert reply.status_code == 202, reply.text
        job = _wait(c, reply.json())
        assert job["state"] == "done" and job["files"] == 1
        assert job["bytes_done"] == job["bytes_total"] == job["cached_bytes"] == 2 * BLOCK
        assert job["rate_bytes_per_s"] > 0 and job["eta_s"] == 0
        stats = c.get("/v1/cache").json()
        assert stats["used_bytes"] == 2 * BLOCK and stats["hub_fetch_bytes"] == 2 * BLOCK
        assert stats["datasets"] == {"ds": 2 * BLOCK} and stats["pinned_bytes"] == 0
        ready = c.get("/readyz").json()
        assert ready["status"] == "ready" and ready["mount"].endswith("mnt")
        assert c.get("/v1/jobs").json()[0]["id"] == job["id"]


def test_prewarm_more_than_fits(spoke: Spoke) -> None:
    with spoke.client() as c:  # 24 blocks of 64 KiB through a 1 MiB cache
        too_big = c.post("/v1/prewarm", json={"dataset": "ds", "paths": ["train"], "pin": True})
        assert too_big.status_code == 409 and "cannot pin" in too_big.json()["detail"]
        assert c.get("/v1/pins").json() == [] and c.get("/v1/cache").json()["used_bytes"] == 0
        job = _wait(c, c.post("/v1/prewarm", json={"dataset": "ds", "paths": ["train"]}).json())
        assert job["state"] == "done"
        assert job["cached_bytes"] < job["bytes_total"]
        assert "stayed cached" in job["message"]


def test_pins_hold_blocks_and_persist_across_restart(spoke: Spoke) -> None:
    with spoke.client() as c:
        pin = c.post("/v1/pins", json={"dataset": "ds", "paths": ["val/v.bin"]})
        assert pin.status_code == 201
        pin_id = pin.json()["id"]
        (spoke.tmp / "mnt" / "ds" / "v1" / "val" / "v.bin").read_bytes()
        for f in sorted((spoke.tmp / "mnt" / "ds" / "v1" / "train").iterdir()):
            f.read_bytes()  # 1.5 MiB through a 1 MiB cache: evicts, but never the pin
        assert c.get("/v1/pins").json()[0]["id"] == pin_id
    assert spoke.stack.spoke is not None
    stop_process(spoke.stack.spoke)
    admin = spoke.stack.start_spoke(
        spoke.hub,
        spoke.tmp / "cache",
        spoke.tmp / "mnt",
        "1MiB",
        extra=("--admin-token-file", str(spoke.token_file)),
    )
    with httpx.Client(base_url=admin, headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        assert [p["id"] for p in c.get("/v1/pins").json()] == [pin_id]
        before = c.get("/v1/cache").json()["hub_fetch_bytes"]
        (spoke.tmp / "mnt" / "ds" / "v1" / "val" / "v.bin").read_bytes()
        assert c.get("/v1/cache").json()["hub_fetch_bytes"] == before  # still cached
        assert c.request("DELETE", f"/v1/pins/{pin_id}").status_code == 200
        assert c.get("/v1/pins").json() == []
        evicted = c.post("/v1/evict", json={"all": True}).json()
        assert evicted["used_bytes"] == 0 and evicted["evicted_blocks"] > 0


def test_evict_a_version_keeps_pinned_blocks(spoke: Spoke) -> None:
    with spoke.client() as c:
        c.post("/v1/pins", json={"dataset": "ds", "paths": ["val"]})
        _wait(
            c,
            c.post("/v1/prewarm", json={"dataset": "ds", "paths": ["val", "train/t0.bin"]}).json(),
        )
        reply = c.post("/v1/evict", json={"dataset": "ds", "ref": "latest"}).json()
        assert reply == {"evicted_blocks": 4, "pinned_blocks_kept": 2, "used_bytes": 2 * BLOCK}


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"dataset": "nope"}, 404),
        ({"dataset": "ds", "ref": "v9"}, 404),
        ({"dataset": "ds", "paths": ["../etc/passwd"]}, 400),
        ({"dataset": "ds", "paths": ["/etc/passwd"]}, 400),
        ({"dataset": "ds", "paths": [""]}, 422),
        ({"dataset": "ds", "paths": ["no-such-file"]}, 400),
        ({"dataset": "ds", "paths": ["x"] * 20_000}, 422),
        ({"dataset": "../ds"}, 422),
        ({"ref": "v1"}, 422),
    ],
)
def test_bad_prewarm_requests(idle_spoke: Spoke, body: dict[str, Any], status: int) -> None:
    with idle_spoke.client() as c:
        reply = c.post("/v1/prewarm", json=body)
        assert reply.status_code == status, reply.text
        assert reply.json()["detail"]
        assert c.get("/v1/jobs").json() == []  # nothing started
        assert c.get("/v1/cache").json()["used_bytes"] == 0  # nothing fetched or evicted


def test_auth_invalid_json_and_unknown_ids(idle_spoke: Spoke) -> None:
    spoke = idle_spoke
    with spoke.client(token=None) as anon:
        assert anon.get("/v1/cache").status_code == 401
        assert anon.get("/v1/cache").json()["detail"] == "missing or wrong bearer token"
        assert anon.get("/healthz").status_code == 200
        assert anon.get("/readyz").status_code == 200
        metrics = anon.get("/metrics")  # every tenant's usage: the node's token only
        assert metrics.status_code == 401, metrics.text
        assert metrics.json()["detail"] == "missing or wrong bearer token"
        assert metrics.headers["www-authenticate"] == "Bearer"
        assert "strata_spoke" not in metrics.text
        assert anon.get("/docs").status_code == 200
    with spoke.client(token="wrong") as wrong:
        assert wrong.post("/v1/evict", json={"all": True}).status_code == 401
        assert wrong.get("/metrics").status_code == 401
    with spoke.client() as c:
        assert "strata_spoke_cache_hits_total" in c.get("/metrics").text
        bad = c.post(
            "/v1/prewarm", content=b"{not json", headers={"Content-Type": "application/json"}
        )
        assert bad.status_code == 422 and bad.json()["detail"]
        assert c.get("/v1/jobs/nope").status_code == 404
        assert c.request("DELETE", "/v1/pins/nope").status_code == 404
        assert c.post("/v1/evict", json={}).status_code == 400
        assert c.get("/v1/jobs").json() == []  # nothing started
        assert c.get("/v1/cache").json()["used_bytes"] == 0  # nothing fetched


def test_cli_prewarm_wait(spoke: Spoke) -> None:
    cli = [
        sys.executable,
        "-m",
        "spoke",
        "prewarm",
        "--admin",
        spoke.admin,
        "--token-file",
        str(spoke.token_file),
    ]
    ok = subprocess.run([*cli, "ds@v1", "val/*", "--wait"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "done" in ok.stdout
    bad = subprocess.run(
        [*cli, "ds@v1", "train", "--pin", "--wait"], capture_output=True, text=True
    )
    assert bad.returncode == 1
    assert bad.stderr.startswith("strata-spoke: error:") and "cannot pin" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
