"""``strata-spoke`` refuses bad settings with one line and exit status 2, starting nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def _spoke(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spoke", *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"--cache-dir": "LONG"}, "is too long: the daemon's socket"),
        ({"--cache-size": "0"}, "--cache-size must be positive"),
        ({"--hub": "nohost"}, "--hub must be HOST:PORT"),
        ({"--log-level": "bogus"}, "--log-level: 'bogus' is not one of DEBUG"),
        ({"--background-fill": "sometimes"}, "--background-fill: Input should be 'auto' or 'off'"),
        ({"--fill-rate": "0"}, "--fill-rate must be a positive size per second"),
        ({"--fill-rate": "fast"}, "--fill-rate: "),
    ],
)
def test_bad_settings_are_one_line_errors(
    tmp_path: Path, change: dict[str, str], message: str
) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    cache = tmp_path / "cache"
    if change.get("--cache-dir") == "LONG":
        change = {"--cache-dir": str(tmp_path / ("d" * 120))}
    flags = {"--hub": "127.0.0.1:1", "--cache-dir": str(cache), "--cache-size": "1GiB"}
    flags.update(change)
    argv = [x for kv in flags.items() for x in kv]
    proc = _spoke("run", *argv, "--mount", str(mnt), "--admin", "127.0.0.1:0")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("strata-spoke: error:")
    assert message in lines[0]
    assert not cache.exists()  # nothing started, nothing written


def test_prewarm_with_an_empty_ref_is_refused_before_any_request() -> None:
    proc = _spoke("prewarm", "--admin", "http://127.0.0.1:9", "ds@")  # discard port: refused
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "strata-spoke: error: 'ds@': give a version or tag after '@', or leave '@' out for latest"
    )
