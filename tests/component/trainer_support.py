"""What the ``strata-train`` component tests (``tests/component/test_trainer_*.py``) share:
``python -m trainer`` run in a subprocess as users run it (:func:`run_cli`), the check
that a refusal is one ``strata-train: error:`` line (:func:`assert_one_line_error`), and
F3 prepared once per module by the command line (the ``f3_mdio`` fixture; import
``f3_mdio_fixture`` to use it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def run_cli(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m trainer ARGS`` and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "trainer", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=cwd,
        check=False,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("strata-train: error: ")
    assert "Traceback" not in proc.stderr
    for word in words:
        assert word in lines[0]


@pytest.fixture(scope="module", name="f3_mdio")
def f3_mdio_fixture(seismic: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """F3 converted once by ``python -m trainer prepare``."""
    out = tmp_path_factory.mktemp("prepared") / "f3.mdio"
    proc = run_cli("prepare", "--segy", seismic / "f3.sgy", "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert "23x18x75" in proc.stdout
    return out
