"""The benches' verdicts on prefetch: bench.hints_mount's mount-vs-simulator and waste
targets, bench.run's waste column and target."""

from __future__ import annotations

from typing import Any

from bench import report
from bench.hints_report import markdown, sim_gaps, verdicts
from bench.scenarios.base import Row
from bench.targets import targets
from bench.wan import LinkSpec

MODES = ("lru", "arc", "sieve", "s3fifo", "hinted")


def _row(trace: str, mount: dict[str, float], sim: dict[str, float], wasted: int = 0) -> Any:
    runs = {m: {"prefetch_wasted_bytes": wasted if m == "lru" else 0} for m in MODES}
    return {
        "trace": trace,
        "all_hinted": True,
        "step_reads": 0,
        "files": 192,
        "cache_blocks": 128,
        "reads": 768,
        "belady": 0.5,
        "hinted_over_belady": 1.0,
        **mount,
        "sim": sim,
        "runs": runs,
        "waste": {m: (wasted / 100e6 if m == "lru" else 0.0) for m in MODES},
    }


SIM = {"lru": 0.225, "arc": 0.243, "sieve": 0.305, "s3fifo": 0.263, "hinted": 0.5}


def test_a_mount_ratio_three_points_under_the_simulator_is_met_four_is_missed() -> None:
    near = _row("shuffled x4, 1 reader", {**SIM, "arc": 0.213 + 1e-9}, SIM)  # 3.0 points
    lines, missed = verdicts([near])
    assert "sim" not in missed and any("vs the simulator" in x and "met" in x for x in lines)
    far = _row("shuffled x4, 1 reader", {**SIM, "arc": 0.203}, SIM)  # 4.0 points
    lines, missed = verdicts([far])
    assert "sim" in missed
    assert sim_gaps([far])[0][2] == "arc"
    assert any("missed: ARC on shuffled x4, 1 reader (4.0)" in x for x in lines)


def test_waste_over_five_percent_on_a_shuffled_trace_is_missed_and_shown() -> None:
    ok = _row("shuffled x4, 1 reader", SIM, SIM, wasted=5_000_000)  # 5 % of 100 MB
    assert "waste" not in verdicts([ok])[1]
    bad = _row("shuffled x4, 1 reader", SIM, SIM, wasted=6_000_000)
    lines, missed = verdicts([bad])
    assert "waste" in missed and any("worst 6.0 % of hub bytes" in x for x in lines)
    assert "0.225 · waste 6.0 MB (6.0 %)" in markdown([bad])
    scan = _row("scan-polluted", SIM, SIM, wasted=6_000_000)  # not a shuffled trace
    assert "waste" not in verdicts([scan])[1]


def test_bench_run_rows_show_hit_ratio_and_waste_and_the_target_judges_them() -> None:
    cold = Row("strata-cold")
    cold.add_spoke({"hits": 75.0, "misses": 25.0, "hub_bytes": 100e6})
    cold.add_spoke({"prefetch_wasted_bytes": 6e6, "hub_bytes": 20e6})  # a second mount
    assert cold.hit_ratio == 0.75 and cold.waste_fraction == 0.05
    local = Row("local")
    assert local.hit_ratio is None and local.waste_fraction is None
    result = {"scenarios": [cold.to_dict(), local.to_dict()]}
    cells = dict(zip(report.COLUMNS, report.table_rows(result)[0], strict=True))
    assert cells["hit ratio"] == "0.750"
    assert cells["prefetch waste (MB, % of hub)"] == "6.0 (5.0 %)"
    link = LinkSpec(0.05, 1e9, 0.0)
    [met] = [t for t in targets({"strata-cold": cold}, link) if "waste" in t["name"]]
    assert met["met"] is True and met["measured"] == "5.0 % (Strata cold)"
    cold.add_spoke({"prefetch_wasted_bytes": 1e6})
    [missed] = [t for t in targets({"strata-cold": cold}, link) if "waste" in t["name"]]
    assert missed["met"] is False
