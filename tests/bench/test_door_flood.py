"""bench.door_flood: bad arguments are clear errors; a short run puts gRPC core's cap and
the door (remembering who proved a token, and not) side by side."""

from __future__ import annotations

import pytest

from bench.door_flood import main

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    "argv", [["--rates", "x"], ["--rates", "-5"], ["--addresses", "0"], ["--seconds", "1"]]
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and "error:" in capsys.readouterr().err


def test_a_short_flood_is_measured_at_both_ports(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--rates", "50", "--addresses", "8", "--seconds", "4"])
    rows = [line.split("|") for line in capsys.readouterr().out.splitlines()]
    rows = [row for row in rows if len(row) > 3 and row[1].strip().startswith("50 (")]
    assert [row[2].strip() for row in rows] == ["grpc-cap", "door", "door-new"]
    for row in rows[1:]:
        door = row[3].strip().split(" of ")
        assert door[0] == door[1] != "0"  # 50 a second is below the cap: every new peer in
