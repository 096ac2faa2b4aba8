"""Read-order hints through a real hub, spoke and mount: ``POST /v1/hints`` validation,
streams per reader (``GET``/``DELETE /v1/hints``), and hinted shuffled epochs of a dataset
1.5x the cache, read by two readers in lockstep, fetching no more than 1/0.95 of what
Belady's optimum needs (Belady 1966; NoPFS, Dryden et al., SC 2021)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.hints_mount import read_all
from bench.hints_workload import epoch_orders, make_files, path_of
from bench.policy_sim import belady
from deploy.local import LocalStack
from tests.support import publish, requires_fuse

pytestmark = [pytest.mark.fuse, requires_fuse]

BLOCK = 65_536
FILES = 48  # one block each: 3 MiB through a 2 MiB (32-block) cache
CACHE_BLOCKS = 32
EPOCHS = 3
TOKEN = "hint-token"


@dataclass
class Spoke:
    admin: str
    mnt: Path
    sha: dict[int, str]

    def client(self, token: str | None = TOKEN) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.admin, headers=headers, timeout=30)


@contextlib.contextmanager
def _spoke(root: Path) -> Iterator[Spoke]:
    """A hub serving ``ds`` and a mounted spoke with an admin token, under ``root``."""
    sha = make_files(root / "src", FILES, BLOCK, seed=3)
    publish(root / "hub", "ds", root / "src", "--block-size", str(BLOCK))
    token_file = root / "token"
    token_file.write_text(TOKEN + "\n")
    with LocalStack() as stack:
        hub = stack.start_hub(root / "hub")
        admin = stack.start_spoke(
            hub,
            root / "cache",
            root / "mnt",
            f"{CACHE_BLOCKS * BLOCK}",
            extra=("--admin-token-file", str(token_file)),
        )
        yield Spoke(admin, root / "mnt", sha)


@pytest.fixture
def spoke(tmp_path: Path) -> Iterator[Spoke]:
    """A fresh spoke, for a test that reads and fetches."""
    with _spoke(tmp_path) as s:
        yield s


@pytest.fixture(scope="module")
def idle_spoke(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Spoke]:
    """One spoke for the tests whose requests are all refused: each checks afterwards that
    its cache is still empty and no hint installed, so sharing it only adds the earlier
    refusals to what each must find unchanged."""
    with _spoke(tmp_path_factory.mktemp("idle")) as s:
        yield s


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"dataset": "nope", "paths": [path_of(0)]}, 404),
        ({"dataset": "ds", "ref": "v9", "paths": [path_of(0)]}, 404),
        ({"dataset": "ds", "paths": ["train/missing.bin"]}, 400),
        ({"dataset": "ds", "paths": ["train"]}, 400),  # a directory, not a file
        ({"dataset": "ds", "paths": ["../../etc/passwd"]}, 400),
        ({"dataset": "ds", "paths": ["/etc/passwd"]}, 400),
        ({"dataset": "ds", "paths": ["/" + path_of(0)]}, 400),  # absolute, even if it exists
        ({"dataset": "ds", "paths": [path_of(0).replace("/", "//")]}, 400),
        ({"dataset": "ds", "paths": [path_of(0) + "/"]}, 400),
        ({"dataset": "ds", "paths": ["./" + path_of(0)]}, 400),
        ({"dataset": "ds", "paths": [path_of(0)], "bogus": 1}, 422),  # unknown field
        ({"dataset": "ds", "paths": [path_of(0)], "append": "yes"}, 422),  # not a bool
        ({"dataset": "ds", "paths": []}, 422),
        ({"dataset": "../ds", "paths": [path_of(0)]}, 422),
        ({"dataset": "ds", "paths": [path_of(0)], "stream": "Rank/0"}, 422),
    ],
)
def test_bad_hint_requests(idle_spoke: Spoke, body: dict[str, Any], status: int) -> None:
    with idle_spoke.client() as c:
        reply = c.post("/v1/hints", json=body)
        assert reply.status_code == status, reply.text
        assert reply.json()["detail"]
        assert c.get("/v1/cache").json()["used_bytes"] == 0  # nothing prefetched
        assert c.get("/v1/hints").json() == []  # nothing installed


def test_hint_needs_the_token(idle_spoke: Spoke) -> None:
    with idle_spoke.client(token=None) as anon:
        reply = anon.post("/v1/hints", json={"dataset": "ds", "paths": [path_of(0)]})
        assert reply.status_code == 401
        assert anon.get("/v1/hints").status_code == 401
        assert anon.delete("/v1/hints/default").status_code == 401
    with idle_spoke.client() as c:
        assert c.get("/v1/cache").json()["used_bytes"] == 0  # nothing prefetched
        assert c.get("/v1/hints").json() == []  # nothing installed


def test_two_readers_hinted_come_close_to_belady(spoke: Spoke) -> None:
    orders = epoch_orders(FILES, EPOCHS, readers=2, seed=3)
    with spoke.client() as c:
        before = _fetched(c)
        for r, order in enumerate(orders):
            body = {"dataset": "ds", "ref": "v1", "paths": [path_of(i) for i in order]}
            reply = c.post("/v1/hints", json={**body, "stream": f"rank{r}"})
            assert reply.status_code == 202, reply.text
            answer = reply.json()
            assert answer["stream"] == f"rank{r}" and answer["version"] == "v1"
            assert answer["blocks"] == answer["hint_length"] == len(order)
        listed = c.get("/v1/hints").json()
        assert [(s["stream"], s["source"]) for s in listed] == [
            ("rank0", "ds@v1"),
            ("rank1", "ds@v1"),
        ]
        # bytes checked; at each step the policy has seen every read so far (see below)
        trace, who = read_all(
            spoke.mnt / "ds" / "v1", orders, spoke.sha, step=4, at_step=_reported(c)
        )
        fetched = _fetched(c) - before
        stats = c.get("/v1/cache").json()
        assert stats["used_bytes"] <= CACHE_BLOCKS * BLOCK
        assert c.delete("/v1/hints/rank0").json() == {"stream": "rank0", "removed": True}
        assert c.delete("/v1/hints/rank0").status_code == 404
        assert [s["stream"] for s in c.get("/v1/hints").json()] == ["rank1"]
    assert sorted(who) == [0] * len(orders[0]) + [1] * len(orders[1])
    hinted = 1 - fetched / len(trace)
    optimum = belady(trace, CACHE_BLOCKS)
    print(f"hinted hit ratio {hinted:.3f} (hub fetches), Belady {optimum:.3f}")
    assert hinted >= 0.95 * optimum


def _reported(c: httpx.Client) -> Callable[[int], None]:
    """A step action that waits until the hint streams' cursors have followed ``reads``
    reads. The mount reports hits at most every 10 ms (fusemount/hits.py: a trainer's
    prefetch window is seconds long), but these readers read 64 KiB files as fast as the
    page cache serves them, a file every few milliseconds; unawaited, the cursors would
    trail by a few reads, and blocks read a moment ago would look like the next ones
    planned. What is measured here is the hinted policy's choices, so each step starts
    once the daemon knows where the readers are, as a trainer's compute time lets it.

    Raises:
        AssertionError: the cursors did not follow within 30 s.
    """

    def wait(reads: int) -> None:
        deadline = time.monotonic() + 30
        while (seen := sum(s["cursor"] for s in c.get("/v1/hints").json())) < reads:
            assert time.monotonic() < deadline, f"cursors at {seen} of {reads} reads"
            time.sleep(0.002)

    return wait


def _fetched(c: httpx.Client) -> int:
    for line in c.get("/metrics").text.splitlines():
        if line.startswith("strata_spoke_hub_fetch_blocks_total "):
            return int(float(line.split()[1]))
    raise AssertionError("no strata_spoke_hub_fetch_blocks_total")
