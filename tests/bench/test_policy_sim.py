"""The policy simulator: Belady's MIN on hand-checked traces, and the bound it gives."""

from __future__ import annotations

import random

import pytest

from bench.policy_sim import (
    ONLINE,
    belady,
    default_gap,
    main,
    mixed,
    mixed_gap,
    simulate,
    unhinted_ratio,
)
from bench.traces import scan_polluted, shuffled_epochs, traces, two_jobs, zipf


def test_belady_hand_checked() -> None:
    # room for 2: at the miss on 3, 1 is next used at t=3 and 2 at t=4, so MIN evicts 2;
    # then 1 hits and 2 misses again: 1 hit in 5 reads.
    assert belady([1, 2, 3, 1, 2], 2) == 1 / 5
    assert belady([1, 1, 1], 1) == 2 / 3
    assert belady([], 3) == 0.0


def test_loop_defeats_lru_but_not_min() -> None:
    loop = list(range(10)) * 5
    assert simulate("lru", loop, 9) == 0.0
    assert belady(loop, 9) > 0.7


def test_min_bounds_every_policy() -> None:
    rng = random.Random(1)
    for keys in (shuffled_epochs(100, 4, rng), zipf(100, 600, 1.0, rng)):
        best = belady(keys, 40)
        for name in ONLINE:
            assert simulate(name, keys, 40) <= best + 1e-12


def test_cli_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--blocks", "200", "--epochs", "3"]) == 0
    out = capsys.readouterr().out
    assert "| trace | DL | lru | arc | sieve | s3fifo | hinted | belady |" in out
    assert "2 jobs:" in out and "scan-polluted:" in out and "targets: " in out


def test_cli_refuses_a_dataset_of_one_block() -> None:
    with pytest.raises(SystemExit) as err:
        main(["--blocks", "1"])
    assert err.value.code == 2


def test_mixed_traces_keep_each_jobs_order_and_count() -> None:
    rng = random.Random(2)
    trace, train = two_jobs(100, 3, rng)
    assert len(trace) == 600 and [k for k in trace if k < 100] == train
    assert all(100 <= k < 150 for k in trace if k >= 100)
    trace, train = scan_polluted(50, 4, rng)
    scan = [k for k in trace if k >= 50]
    assert [k for k in trace if k < 50] == train and scan == list(range(50, 250))


def test_every_dl_trace_is_marked_and_the_default_gap_is_computed() -> None:
    names = {t.name: t.dl for t in traces(60, 2, 0)}
    assert [n for n, dl in names.items() if not dl] == [
        "scan (cache = 0.5x data)",
        "loop x4 (data/cache 1.5)",
        "zipf s=0.9 (cache = 0.1x data)",
        "zipf s=1.1 (cache = 0.1x data)",
    ]
    row: dict[str, float | str | bool] = {"lru": 0.2, "arc": 0.25, "sieve": 0.34, "s3fifo": 0.3}
    assert default_gap(row, "arc") == pytest.approx(9.0)
    assert default_gap(row, "sieve") == 0.0


def test_hinted_column_reaches_belady_on_shuffled_epochs() -> None:
    from bench.policy_sim import hint_ratio, run

    rows = run(blocks=300, epochs=3, seed=1)
    for row in rows:
        assert float(row["hinted"]) <= float(row["belady"]) + 1e-9
        if str(row["trace"]).startswith("shuffled") and "(data/cache 1.5)" in str(row["trace"]):
            assert hint_ratio(row) >= 0.95
            assert float(row["hinted"]) > float(row["arc"])


@pytest.mark.parametrize("inner", ONLINE)
def test_hinted_never_trails_its_inner_policy_when_one_job_posts_no_hint(inner: str) -> None:
    """Issue 25: with one of two jobs hinting, the old rule (unhinted blocks go first) lost
    the other job's hot set, below every plain policy. Now for each wrapped policy, on the
    two mixed traces, both jobs together and the unhinted job alone hit at least as often."""
    checked = 0
    for trace in traces(300, 3, 0):
        if not mixed(trace):
            continue
        assert trace.streams is not None
        checked += 1
        args = (trace.keys, trace.cache_blocks, trace.streams)
        both = simulate("hinted", *args, inner=inner)
        assert both >= simulate(inner, *args), trace.name
        alone = unhinted_ratio("hinted", *args, inner=inner)
        assert alone >= unhinted_ratio(inner, *args), trace.name
    assert checked == 2


def test_hinted_keeps_a_zipf_hot_set_beside_a_hinted_job() -> None:
    rng = random.Random(3)
    trace, train = two_jobs(200, 3, rng)
    args = (trace, 150, [train])
    assert unhinted_ratio("sieve", *args) > 0.7  # the hot set: SIEVE alone keeps it
    assert unhinted_ratio("hinted", *args, inner="sieve") >= unhinted_ratio("sieve", *args)
    assert simulate("hinted", *args, inner="sieve") > simulate("sieve", *args) + 0.05


def test_the_mixed_rows_carry_the_unhinted_jobs_ratio() -> None:
    from bench.policy_sim import run

    rows = [r for r in run(blocks=200, epochs=2, seed=0) if r["mixed"]]
    assert [str(r["trace"]).split(":")[0] for r in rows] == ["2 jobs", "scan-polluted"]
    for row in rows:
        assert mixed_gap(row) <= 0.0
        assert 0.0 <= float(row["unhinted:hinted"]) <= 1.0
    assert mixed_gap({"mixed": False}) == 0.0
