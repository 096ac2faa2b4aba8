"""bench.admin_flood: bad arguments are clear errors; a short run puts the scan and the
ledger side by side, every probe counted."""

from __future__ import annotations

import pytest

from bench.admin_flood import main

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    "argv", [["--rates", "x"], ["--rates", "0"], ["--addresses", "-1"], ["--seconds", "1"]]
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and "error:" in capsys.readouterr().err


def test_a_short_flood_is_measured_under_both_rules(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--rates", "100", "--addresses", "4", "--seconds", "4"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 100 |")]
    assert [row.split("|")[2].strip() for row in rows] == ["scan", "ledger"]
    for row in rows:
        assert row.split("|")[3].strip() == "2 of 2"  # 100 a second is no flood: all answered
