"""bench.mesh: bad arguments are clear errors; the table puts the runs side by side."""

from __future__ import annotations

import pytest

from bench.mesh import Result, main, markdown
from bench.wan import LinkSpec


@pytest.mark.parametrize(
    "argv",
    [["--spokes", "0"], ["--spokes", "x"], ["--size", "1MiB", "--file-size", "8MiB"]],
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and "error:" in capsys.readouterr().err


def test_markdown_compares_with_one_spoke_alone() -> None:
    alone = Result(1, False, 100, 100, [2.0], 0.5, 0)
    mesh = Result(2, True, 100, 102, [2.2, 2.0], 0.4, 100)
    table = markdown([alone, mesh], LinkSpec(0.05, 1e9))
    assert "| 2 | mesh | 1.02× | 2.2 | 2.1 | 1.10× | 40% | 0 |" in table


@pytest.mark.parametrize("argv", [["--size", "0"], ["--seconds", "-1"], ["--size", "x"]])
def test_peer_flood_bad_arguments_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from bench import peer_flood

    with pytest.raises(SystemExit) as exc:
        peer_flood.main(argv)
    assert exc.value.code == 2 and "error:" in capsys.readouterr().err
