"""bench.handshake_flood and bench.bulk_stall: bad arguments are clear errors; a short
stall run against a real hub prints what it held."""

from __future__ import annotations

import pytest

from bench import bulk_stall, handshake_flood

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    "argv", [["--rate", "0"], ["--addresses", "0"], ["--seconds", "1"], ["--rate", "x"]]
)
def test_handshake_flood_bad_arguments_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        handshake_flood.main(argv)
    assert exc.value.code == 2 and "error:" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--connections", "0"], ["--hold", "0"]])
def test_bulk_stall_bad_arguments_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        bulk_stall.main(argv)
    assert exc.value.code == 2 and "error:" in capsys.readouterr().err


def test_a_short_stall_is_measured(capsys: pytest.CaptureFixture[str]) -> None:
    assert bulk_stall.main(["--connections", "8", "--hold", "0.5"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("8 stalled TLS bulk connections of one token: hub RSS ")
