"""Background fill is on by default: a spoke started with no fill flags fetches the rest of
a small snapshot once it is read, says so in its log, serves a demand miss during the fill
ahead of it, and leaves a snapshot larger than its share of the cache alone."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.wan import LinkSpec, WanProxy, parse_hostport
from deploy.local import LocalStack, admin_headers
from spoke.fetch.window import FLOOR_BYTES
from tests.support import eventually, publish, requires_fuse, sha256

pytestmark = [pytest.mark.fuse, requires_fuse]

BLOCK = 256 << 10
FILES = 256  # 64 MiB: about 5 s of the 100 Mbit/s link below
RTT = 0.02
RATE = 100e6  # bits/s


@pytest.fixture
def source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    for i in range(FILES):
        (src / "d" / f"f{i:03d}.bin").write_bytes(os.urandom(BLOCK))
    assert publish(tmp_path / "hub", "ds", src, "--block-size", str(BLOCK)) == "v1"
    return src


@pytest.fixture
def stack() -> Iterator[LocalStack]:
    with LocalStack(log_level="INFO") as s:
        yield s


def _fill(cache: Path) -> dict[str, Any]:
    url = (cache / "admin.url").read_text().strip()
    stats = httpx.get(f"{url}/v1/cache", headers=admin_headers(cache), timeout=5).json()
    fill: dict[str, Any] = stats["fill"]
    return fill


def _snapshot(fill: dict[str, Any]) -> dict[str, Any] | None:
    snaps: list[dict[str, Any]] = fill["snapshots"]
    return snaps[0] if snaps else None


@pytest.mark.timing
def test_a_spoke_with_no_flags_fills_a_small_snapshot_and_serves_demand_first(
    tmp_path: Path, source: Path, stack: LocalStack, capfd: pytest.CaptureFixture[str]
) -> None:
    hub = stack.start_hub(tmp_path / "hub")
    cache, mnt = tmp_path / "cache", tmp_path / "mnt"
    with WanProxy(parse_hostport(hub), LinkSpec(rtt_s=RTT, rate_bps=RATE)) as wan:
        stack.start_spoke(wan.address, cache, mnt, "256MiB")  # no fill flags
        files = mnt / "ds" / "v1" / "d"
        assert sha256(files / "f000.bin") == sha256(source / "d" / "f000.bin")
        fill = eventually(lambda: _snapshot(_fill(cache)), "the read started a fill")
        assert _fill(cache)["mode"] == "auto"
        assert fill["snapshot"] == "ds@v1" and fill["state"] == "filling", fill
        # a reader jumps to the end of the snapshot (the fill goes in manifest order)
        started = time.monotonic()
        assert sha256(files / f"f{FILES - 1:03d}.bin") == sha256(
            source / "d" / f"f{FILES - 1:03d}.bin"
        )
        waited = time.monotonic() - started
        during = _snapshot(_fill(cache))
        assert during is not None and during["bytes_remaining"] > 4 * BLOCK, during
        behind_fill = during["bytes_remaining"] * 8 / RATE  # had it waited for the fill
        # behind at most one window of fill bytes on the wire, never behind the fill's queue
        bound = 4 * RTT + (FLOOR_BYTES + BLOCK) * 8 / RATE + 0.4  # + slack for a loaded machine
        assert bound < behind_fill, (bound, during)  # else the test proves nothing
        assert waited <= bound, (waited, during)
        done = eventually(
            lambda: (s := _snapshot(_fill(cache))) and s["state"] == "done" and s,
            lambda: f"the fill did not finish: {_fill(cache)}",
            timeout=60,
        )
        assert done["bytes_resident"] == done["bytes_total"] == FILES * BLOCK
    for i in range(0, FILES, 7):  # the link is gone: every byte is local now
        assert sha256(files / f"f{i:03d}.bin") == sha256(source / "d" / f"f{i:03d}.bin")
    log = capfd.readouterr().err
    assert "background fill on" in log and "--background-fill off turns it off" in log, log[-2000:]
    assert "background fill of ds@v1: filling" in log


def test_the_fill_stays_off_when_the_snapshot_exceeds_the_share(
    tmp_path: Path, source: Path, stack: LocalStack
) -> None:
    hub = stack.start_hub(tmp_path / "hub")
    cache, mnt = tmp_path / "cache", tmp_path / "mnt"
    stack.start_spoke(hub, cache, mnt, "64MiB")  # half of it, 32 MiB < the 64 MiB snapshot
    files = mnt / "ds" / "v1" / "d"
    assert sha256(files / "f000.bin") == sha256(source / "d" / "f000.bin")
    fill = eventually(lambda: _snapshot(_fill(cache)), "the read was seen by the fill")
    assert fill["state"] == "too large" and fill["bytes_total"] == FILES * BLOCK, fill
    assert "33,554,432 bytes" in fill["reason"]
    url = (cache / "admin.url").read_text().strip()
    # no condition to wait on: a "too large" fill makes no pass that could be counted; a
    # wrongly started one would have fetched blocks over the loopback hub within 1 s
    time.sleep(1.0)
    metrics = httpx.get(f"{url}/metrics", headers=admin_headers(cache), timeout=5).text
    assert "\nstrata_spoke_fill_bytes_total 0.0\n" in metrics
    after = _snapshot(_fill(cache))
    assert after is not None and after["state"] == "too large" and after["bytes_filled"] == 0
    assert after["bytes_resident"] == BLOCK  # the one file read, no more
