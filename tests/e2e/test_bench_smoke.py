"""Smoke run of the side-by-side benchmark: ``python -m bench.run --quick --rtt-ms 10``
(a shorter link than the default 50 ms: the rows' round trips cost less, as in the
other benchmark smoke runs).

Asserts only that the harness works (a result JSON with a row per scenario, the table,
the plots); never a speed. Scenarios whose tools are missing here (fio, rclone,
httpdirfs: ``make bench-deps``) must show up as skipped, not fail the run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.run import LABELS
from tests.support import requires_fuse, run_module

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.fuse, requires_fuse]

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_quick_bench_writes_json_table_and_plots(seismic: Path, tmp_path: Path) -> None:
    results = tmp_path / "results"
    markdown = tmp_path / "BENCHMARKS.md"
    markdown.write_text("# Benchmarks\n\nHand-written notes stay.\n")
    env = {**os.environ, "STRATA_SEISMIC_DIR": str(seismic)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.run",
            "--quick",
            "--rtt-ms",
            "10",
            "--data-cache",
            str(tmp_path / "data"),
            "--results",
            str(results),
            "--markdown",
            str(markdown),
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    (json_path,) = results.glob("*.json")
    result = json.loads(json_path.read_text())
    rows = {row["name"]: row for row in result["scenarios"]}
    assert set(rows) == set(LABELS)
    for name, row in rows.items():
        assert row["status"] in ("ok", "skipped"), (name, row["reason"])
    for name in ("local", "floor", "copy-first", "strata-cold", "strata-warm-dropped"):
        assert rows[name]["status"] == "ok"
    assert rows["local"]["trainer"]["steps"] == 3
    assert rows["strata-cold"]["first_byte_s"] > 0
    assert rows["strata-cold"]["cold"]["link_down_bytes"] > 0
    assert rows["copy-first"]["cold"]["bytes_read"] == result["dataset"]["bytes"]
    tools = {"rclone": "rclone", "httpdirfs": "httpdirfs"}
    for row_prefix, tool in tools.items():
        expected = "ok" if shutil.which(tool) else "skipped"
        assert rows[f"{row_prefix}-cold"]["status"] == expected
    if shutil.which("fio"):
        for name in ("floor", "strata-warm-dropped"):
            assert set(rows[name]["fio"]) == {"seq_1m", "rand_4k", "rand_1m"}
    assert result["targets"]

    for plot in result["plots"]:
        assert Path(plot).is_file()
        assert Path(plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for label in LABELS.values():
        assert f"| {label} |" in proc.stdout
    text = markdown.read_text()
    assert "Hand-written notes stay." in text
    assert "| Strata cold |" in text


def test_prewarm_link_bench_measures_the_link(tmp_path: Path) -> None:
    out = tmp_path / "prewarm.json"
    proc = run_module(
        "bench.prewarm_link", "--size", "8MiB", "--only", "chunks,small", "--rtt-ms", "10",
        "--json", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    assert [r["shape"] for r in results] == ["chunks", "small"]
    for r in results:
        assert r["state"] == "done" and r["bytes_total"] == 8 << 20
        assert r["link_down_bytes"] >= r["bytes_total"]  # every byte crossed the link
        assert 0 < r["link_utilisation"] <= 1.05
    assert "| 64 KiB files | 128 |" in proc.stdout
