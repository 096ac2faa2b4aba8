"""bench.dlio: the emulated run (``--emulate``) writes its AU table, by DLIO's rule, on a
tiny NPZ set from local disk; and the real-DLIO path's log parsing, aggregation and table.

The Strata rows (publish, hub, spoke, mount) are left out of the smoke run: they cost about
8 s more than the 2 s it takes, and the mount's reads are what the fuse tests cover."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import dlio, dlio_emulate

COMPUTE_SCALE = 0.05


def _rows(table: str) -> list[list[str]]:
    lines = [line for line in table.splitlines() if line.startswith("| ")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[1:]]


def test_emulated_run_writes_its_au_table_by_dlios_rule(tmp_path: Path) -> None:
    out, table_path = tmp_path / "dlio.json", tmp_path / "au.md"
    args = ["--emulate", "--local-only", "--keep-page-cache", "--files", "12",
            "--record-mib", "0.0625", "--batch", "2", "--compute-scale", str(COMPUTE_SCALE),
            "--ranks", "1,2", "--work", str(tmp_path / "work"), "--json", str(out),
            "--table", str(table_path)]  # fmt: skip
    assert dlio.main(args) == 0
    report = json.loads(out.read_text())
    table = table_path.read_text()
    assert table.startswith("emulated (bench.dlio_emulate): unet3d_h100 with 12 files")
    rows = _rows(table)
    assert [r[:2] for r in rows] == [["local disk", "1"], ["", "2"]]
    compute_s = dlio_emulate.COMPUTE_S * COMPUTE_SCALE
    npz = sorted((tmp_path / "work" / "data" / "train").glob("img_*_of_12.npz"))
    set_bytes = sum(p.stat().st_size for p in npz)
    assert len(npz) == 12
    for run, row in zip(report["runs"], rows, strict=True):
        ranks, records = run["ranks"], run["records"]
        assert run["compute_s"] == compute_s
        assert sorted((r["rank"], r["epoch"]) for r in records) == [
            (rank, epoch) for rank in range(ranks) for epoch in range(2)
        ]
        per_epoch: dict[int, list[float]] = {0: [], 1: []}
        for r in records:
            steps = 12 // (2 * ranks)
            assert r["steps"] == steps
            # the first step holds the readers' start and is left out, as DLIO does
            assert r["compute_s"] == pytest.approx((steps - 1) * compute_s)
            assert r["wait_s"] >= 0.0
            au = 100.0 * r["compute_s"] / (r["compute_s"] + r["wait_s"])
            assert r["au"] == pytest.approx(au) and 0.0 <= au <= 100.0
            per_epoch[r["epoch"]].append(au)
        means = [sum(a) / len(a) for a in per_epoch.values()]
        au = sum(means) / 2
        assert run["au"] == pytest.approx(au) and 0.0 <= run["au"] <= 100.0
        assert run["au_sd"] == pytest.approx(abs(means[0] - means[1]) / 2)
        rank0 = sorted((r for r in records if r["rank"] == 0), key=lambda r: r["epoch"])
        assert run["epoch_au"] == [r["au"] for r in rank0]
        # every file is read once an epoch (12 = steps x batch x ranks)
        for epoch in range(2):
            assert sum(r["bytes"] for r in records if r["epoch"] == epoch) == set_bytes
        assert row[2] == f"{run['au']:.1f} (± {run['au_sd']:.1f})"
        assert row[3] == ", ".join(f"{a:.1f}" for a in run["epoch_au"])
        assert float(row[4]) == round(run["io_mb_s"]) and run["io_mb_s"] > 0
    kept = max((r["ranks"] for r in report["runs"] if r["au"] >= dlio.AU_TARGET), default=0)
    assert report["accelerators_at_au_target"]["local"] == kept
    assert table.endswith(f"Accelerators kept at AU >= 90 %: local disk {kept}\n")


# rank 0's block lines and the [METRIC] block of a real run (dlio-benchmark 2.0.0, 2 epochs)
DLIO_LOG = """\
[INFO] 2026-12-06T16:13:34.596385 Epoch 1 - Block 1 [Training] Accelerator Utilization [AU] (%): 96.1113 [statscounter.py:285]
[INFO] 2026-12-06T16:13:34.596385 Epoch 1 - Block 1 [Training] Throughput (samples/second): 20.6482 [statscounter.py:286]
[INFO] 2026-12-06T16:13:35.281128 Epoch 2 - Block 1 [Training] Accelerator Utilization [AU] (%): 98.9549 [statscounter.py:285]
[METRIC] ==========================================================
[METRIC] Number of Simulated Accelerators: 1
[METRIC] Training Accelerator Utilization [AU] (%): 97.5331 (1.4218)
[METRIC] Training Throughput (samples/second): 17.5793 (3.0689)
[METRIC] Training I/O Throughput (MB/second): 17.5793 (3.0689)
[METRIC] train_au_meet_expectation: success
[METRIC] ==========================================================
"""  # noqa: E501


def test_dlio_log_parses_to_the_runs_figures_and_table() -> None:
    got = dlio.parse_output(DLIO_LOG)
    assert got == {"au": 97.5331, "au_sd": 1.4218, "epoch_au": [96.1113, 98.9549],
                   "io_mb_s": 17.5793}  # fmt: skip
    assert dlio.parse_output(DLIO_LOG.replace("I/O Throughput", "I/O rate")) is None
    assert dlio.parse_output("Traceback (most recent call last):") is None
    runs = [
        {"source": "local", "ranks": 1, **got},
        {"source": "local", "ranks": 2, "au": 89.96, "au_sd": 0.5, "epoch_au": [88.0, 91.9],
         "io_mb_s": 140.4},
        {"source": "strata warm", "ranks": 1, "au": 96.6, "au_sd": 0.8, "epoch_au": [95.8],
         "io_mb_s": 80.0},
    ]  # fmt: skip
    report = dlio._report("dlio-benchmark 2.0.0: test", runs, "50 ms RTT", 0)
    assert report["accelerators_at_au_target"] == {"local": 1, "strata cold": 0, "strata warm": 1}
    table = dlio.au_table(report)
    assert "| local disk | 1 | 97.5 (± 1.4) | 96.1, 99.0 | 18 |" in table
    assert "| | 2 | 90.0 (± 0.5) | 88.0, 91.9 | 140 |" in table  # 89.96 is not >= 90
    assert "| Strata warm | 1 | 96.6 (± 0.8) | 95.8 | 80 |" in table
    assert table.endswith("Accelerators kept at AU >= 90 %: local disk 1, Strata warm 1\n")


def test_au_rule_and_aggregation_follow_dlios_statscounter() -> None:
    assert dlio_emulate.au_percent(0.3, 0.1) == pytest.approx(75.0)
    assert dlio_emulate.au_percent(0.0, 1.0) == 0.0  # one step an epoch: nothing counted
    assert dlio_emulate.au_percent(1.0, 0.0) == 100.0
    mib = dlio_emulate.MIB
    records = [
        {"rank": 0, "epoch": 0, "au": 80.0, "bytes": 4 * mib, "wall_s": 2.0},
        {"rank": 1, "epoch": 0, "au": 60.0, "bytes": 2 * mib, "wall_s": 1.0},
        {"rank": 1, "epoch": 1, "au": 100.0, "bytes": 2 * mib, "wall_s": 2.0},
        {"rank": 0, "epoch": 1, "au": 90.0, "bytes": 4 * mib, "wall_s": 2.0},
    ]
    got = dlio_emulate.aggregate(records)
    # epoch means 70 and 95: their mean and population standard deviation
    assert got["au"] == pytest.approx(82.5) and got["au_sd"] == pytest.approx(12.5)
    assert got["epoch_au"] == [80.0, 90.0]
    assert got["io_mb_s"] == pytest.approx(((2 + 2) + (2 + 1)) / 2)
