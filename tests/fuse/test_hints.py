"""Read-order hints through a real hub, spoke and mount: ``POST /v1/hints`` validation, and
a hinted shuffled multi-epoch read of a dataset 1.5x the cache scoring close to Belady's
optimum (Belady 1966; NoPFS, Dryden et al., SC 2021)."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.policy_sim import belady
from deploy.local import LocalStack
from tests.support import publish, requires_fuse

pytestmark = [pytest.mark.fuse, requires_fuse]

BLOCK = 65_536
FILES = 24  # one block each: 1.5 MiB through a 1 MiB (16-block) cache
CACHE_BLOCKS = 16
EPOCHS = 3
TOKEN = "hint-token"


@dataclass
class Spoke:
    admin: str
    mnt: Path

    def client(self, token: str | None = TOKEN) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.admin, headers=headers, timeout=30)


@pytest.fixture
def spoke(tmp_path: Path) -> Iterator[Spoke]:
    src = tmp_path / "src" / "train"
    src.mkdir(parents=True)
    for i in range(FILES):
        (src / f"f{i:02d}.bin").write_bytes(os.urandom(BLOCK))
    publish(tmp_path / "hub", "ds", tmp_path / "src", "--block-size", str(BLOCK))
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    with LocalStack() as stack:
        hub = stack.start_hub(tmp_path / "hub")
        admin = stack.start_spoke(
            hub,
            tmp_path / "cache",
            tmp_path / "mnt",
            f"{CACHE_BLOCKS * BLOCK}",
            extra=("--admin-token-file", str(token_file)),
        )
        yield Spoke(admin, tmp_path / "mnt")


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"dataset": "nope", "paths": ["train/f00.bin"]}, 404),
        ({"dataset": "ds", "ref": "v9", "paths": ["train/f00.bin"]}, 404),
        ({"dataset": "ds", "paths": ["train/missing.bin"]}, 400),
        ({"dataset": "ds", "paths": ["train"]}, 400),  # a directory, not a file
        ({"dataset": "ds", "paths": []}, 422),
        ({"dataset": "../ds", "paths": ["train/f00.bin"]}, 422),
    ],
)
def test_bad_hint_requests(spoke: Spoke, body: dict[str, Any], status: int) -> None:
    with spoke.client() as c:
        reply = c.post("/v1/hints", json=body)
        assert reply.status_code == status, reply.text
        assert reply.json()["detail"]
        assert c.get("/v1/cache").json()["used_bytes"] == 0  # nothing prefetched


def test_hint_needs_the_token(spoke: Spoke) -> None:
    with spoke.client(token=None) as anon:
        reply = anon.post("/v1/hints", json={"dataset": "ds", "paths": ["train/f00.bin"]})
        assert reply.status_code == 401


def test_hinted_shuffled_epochs_come_close_to_belady(spoke: Spoke) -> None:
    rng = random.Random(3)
    order: list[int] = []
    for _ in range(EPOCHS):
        epoch = list(range(FILES))
        rng.shuffle(epoch)
        order += epoch
    paths = [f"train/f{i:02d}.bin" for i in order]
    with spoke.client() as c:
        reply = c.post("/v1/hints", json={"dataset": "ds", "ref": "v1", "paths": paths})
        assert reply.status_code == 202, reply.text
        assert reply.json()["blocks"] == len(paths) and reply.json()["version"] == "v1"
        before = c.get("/v1/cache").json()["misses"]
        root = spoke.mnt / "ds" / "v1"
        for path in paths:
            assert len((root / path).read_bytes()) == BLOCK
        stats = c.get("/v1/cache").json()
    misses = stats["misses"] - before
    hinted = 1 - misses / len(paths)
    optimum = belady(order, CACHE_BLOCKS)
    print(f"hinted hit ratio {hinted:.3f}, Belady {optimum:.3f}")
    assert stats["used_bytes"] <= CACHE_BLOCKS * BLOCK
    assert hinted >= 0.9 * optimum
