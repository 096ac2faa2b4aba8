"""bench.tenant_link: bad arguments are one-line errors (exit 2) before anything starts."""

from __future__ import annotations

import pytest

from bench import tenant_link


@pytest.mark.parametrize(
    "argv",
    [
        ["--shares", "0"],
        ["--shares", "1.5"],
        ["--shares", "x"],
        ["--shares", ","],
        ["--prewarm", "10KiB"],
        ["--files", "10"],
        ["--rtt-ms", "-1"],
        ["--rate", "fast"],
        ["--readers", "-1"],
    ],
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        tenant_link.main(argv)
    assert exc.value.code == 2 and "error:" in capsys.readouterr().err
