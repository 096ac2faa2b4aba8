"""Smoke run of the hinted-policy benchmark through a real mount: ``python -m
bench.hints_mount`` at a small size, every policy on every kind of trace: shuffled epochs
(two readers only: each policy's run starts a spoke and mount of its own, most of this
test's time, and two readers take every path one does plus the hint streams and step
meetings of several) and each mix. Asserts only that the harness works (rows, runs, waste,
the summary lines); never a ratio. Its own file so that a test worker runs it beside the
other benchmark smoke runs (the longest tests).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import requires_fuse, run_module

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.fuse, requires_fuse]


def test_hints_mount_bench_tabulates_every_policy(tmp_path: Path) -> None:
    out = tmp_path / "hints.json"
    proc = run_module(
        "bench.hints_mount", "--files", "24", "--cache-blocks", "16", "--epochs", "2",
        "--block-kib", "64", "--readers", "2", "--json", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [r["readers"] for r in rows] == [2, 2, 2]
    assert [r["all_hinted"] for r in rows] == [True, False, False]
    modes = ("lru", "arc", "sieve", "s3fifo", "hinted")
    for row, reads, files in zip(rows, (48, 96, 32), (24, 36, 24), strict=True):
        assert row["reads"] == reads and row["files"] == files
        for mode in modes:
            run = row["runs"][mode]
            assert run["reads"] == reads and 0 < run["fetched_blocks"] <= reads + files
        assert 0 < row["belady"] < 1 and set(row["sim"]) == set(modes)
        assert set(row["waste"]) == set(modes) and all(0 <= w <= 1 for w in row["waste"].values())
    assert "| LRU | ARC | SIEVE | S3-FIFO | hinted | Belady |" in proc.stdout
    assert "mean hit ratio over the traces: LRU " in proc.stdout
    assert "through the mount vs the simulator: worst " in proc.stdout
    assert "prefetch waste on shuffled traces: worst " in proc.stdout
