"""The policy simulator: Belady's MIN on hand-checked traces, and the bound it gives."""

from __future__ import annotations

import random

from bench.policy_sim import belady, main, shuffled_epochs, simulate, zipf


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
        for name in ("arc", "lru"):
            assert simulate(name, keys, 40) <= best + 1e-12


def test_cli_prints_the_table() -> None:
    assert main(["--blocks", "200", "--epochs", "3"]) == 0


def test_hinted_column_reaches_belady_on_shuffled_epochs() -> None:
    from bench.policy_sim import hint_ratio, run

    rows = run(blocks=300, epochs=3, seed=1)
    for row in rows:
        assert float(row["hinted"]) <= float(row["belady"]) + 1e-9
        if str(row["trace"]).startswith("shuffled") and "(data/cache 1.5)" in str(row["trace"]):
            assert hint_ratio(row) >= 0.95
            assert float(row["hinted"]) > float(row["arc"])
