"""Per-tenant room for pins and running prewarm jobs (spoke/serve/routes/context.py): a
scoped admin token holds at most its share on its datasets, the operator keeps a reserve."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from spoke.serve.admintokens import OPERATOR, Caller
from spoke.serve.routes.context import LimitReached, job_room, pin_room, share_divisor

A = Caller("team-a", ("a",))
B = Caller("team-b", ("b",))


def _context(running: list[str], pinned: list[str], jobs: int = 16, pins: int = 8) -> Any:
    return cast(
        Any,
        SimpleNamespace(
            jobs=SimpleNamespace(
                all=lambda: (
                    [SimpleNamespace(dataset=d, state="running") for d in running]
                    + [SimpleNamespace(dataset="a", state="done")] * 9
                )
            ),
            pins=SimpleNamespace(all=lambda: [SimpleNamespace(dataset=d) for d in pinned]),
            max_running_jobs=jobs,
            max_pins=pins,
        ),
    )


def test_a_scoped_token_runs_a_quarter_of_the_jobs_and_the_operator_the_rest() -> None:
    job_room(_context(["a"] * 3, []), A)  # 3 of its 4: one more may run
    with pytest.raises(LimitReached, match="'team-a' holds 4 running prewarm jobs"):
        job_room(_context(["a"] * 4, []), A)
    job_room(_context(["a"] * 4, []), B)  # another team is not held by team-a's
    with pytest.raises(LimitReached, match="the last 2 of 16 are kept"):
        job_room(_context(["a"] * 4 + ["b"] * 3 + ["c"] * 7, []), B)
    job_room(_context(["a"] * 4 + ["b"] * 3 + ["c"] * 8, []), OPERATOR)  # 15 of 16
    with pytest.raises(LimitReached, match="16 prewarm jobs are running"):
        job_room(_context(["c"] * 16, []), OPERATOR)


def test_finished_jobs_and_other_datasets_pins_do_not_count() -> None:
    pin_room(_context([], ["b", "b"]), A)
    with pytest.raises(LimitReached, match="'team-a' holds 2 pins"):
        pin_room(_context([], ["a", "a"]), A)
    with pytest.raises(LimitReached, match="8 pins exist"):
        pin_room(_context([], ["x"] * 8), OPERATOR)


def test_with_five_scoped_tokens_four_colluding_leave_the_fifth_its_share() -> None:
    """The eighth probe's case: four tokens at 1/4 each took 7/8 of 1,000 pins and a fifth
    team was refused; with five tokens configured each holds 7/8 ÷ 5 at most."""
    assert [share_divisor(k) for k in (1, 3, 4, 5, 8)] == [4, 4, 5, 6, 10]
    colluders = [Caller(f"col-{i}", (f"c{i}",), tenants=5) for i in range(4)]
    fifth = Caller("team-b", ("b",), tenants=5)
    pinned: list[str] = []
    for caller in colluders:  # each pins until refused
        while True:
            try:
                pin_room(_context([], pinned, pins=1000), caller)
            except LimitReached as err:
                assert "the most a scoped token may (166 of 1000)" in str(err)
                break
            pinned.append(caller.datasets[0])
    assert len(pinned) == 4 * 166
    for _ in range(166):  # the fifth team still gets its whole share
        pin_room(_context([], pinned, pins=1000), fifth)
        pinned.append("b")
    assert len(pinned) == 830 <= 1000 - 1000 // 8
