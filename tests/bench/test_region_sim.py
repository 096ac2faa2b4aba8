"""The region simulator (bench.region_sim): its conservation checks hold, owners are the
real rendezvous function's where it is used, and the first batch's bottleneck moves to the
owners as the region grows."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from bench.region_sim import EXACT_NODES, MEASURED, Job, calibrate, main, owners, simulate
from spoke.mesh.rendezvous import owner

JOB = Job(dataset_bytes=64 << 30)


@pytest.mark.parametrize(("nodes", "replicas"), [(1, 1), (16, 1), (16, 3), (128, 3), (1024, 1)])
def test_every_row_conserves_bytes(nodes: int, replicas: int) -> None:
    row = simulate(nodes, replicas, JOB, MEASURED)
    assert row.checks and all(row.checks.values()), row.checks
    assert row.wan_ratio == 1.0  # each block once per region, whatever the node count
    assert row.hub_egress_per_replica * replicas == row.wan_bytes


def test_owners_below_the_exact_bound_are_the_rendezvous_functions() -> None:
    counts = owners(8, 500, seed=3)
    names = [f"spoke-{i}" for i in range(8)]
    real = Counter(owner(f"block-3-{b}", names) for b in range(500))
    assert counts == [real[n] for n in names]
    assert sum(owners(EXACT_NODES + 1, 1000, seed=1)) == 1000


def test_the_first_batch_is_bound_by_the_owners_fan_out_as_the_region_grows() -> None:
    small = simulate(16, 1, JOB, MEASURED)
    large = simulate(1024, 1, JOB, MEASURED)
    assert large.first_batch_s > small.first_batch_s
    assert large.first_batch_bound.startswith("owner")
    assert large.alone_first_batch_s == small.alone_first_batch_s


def test_no_region_without_nodes_or_replicas() -> None:
    with pytest.raises(ValueError):
        simulate(0, 1, JOB, MEASURED)


def test_the_cli_prints_the_table_and_checks_a_mesh_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mesh = tmp_path / "mesh.json"
    mesh.write_text(
        json.dumps(
            {
                "rtt_s": 0.05,
                "rate_bps": 1e9,
                "results": [
                    {"spokes": 2, "mesh": True, "dataset_bytes": 64 << 20, "pass_s": [1.0, 1.2]},
                    {"spokes": 2, "mesh": False, "dataset_bytes": 64 << 20, "pass_s": [2.0]},
                ],
            }
        )
    )
    out = tmp_path / "sim.json"
    assert (
        main(["--nodes", "4,16", "--replicas", "1", "--calibrate", str(mesh), "--json", str(out)])
        == 0
    )
    printed = capsys.readouterr().out
    assert "| 16 | 1 | 1.00× |" in printed and "calibration, 2 spokes" in printed
    report = json.loads(out.read_text())
    assert len(report["rows"]) == 2 and report["calibration"][0]["measured_s"] == 1.2
    assert calibrate(mesh)[0]["model_s"] > 0
