"""deploy.drain (the spoke pod's preStop): waits while another process has a file open
on the mount, returns once none has, and gives up after its timeout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.conftest import Live

pytestmark = pytest.mark.fuse


def _drain(mount: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "deploy.drain",
            f"--mount={mount}",
            f"--timeout={timeout}",
            "--interval=0.1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _holder(code: str) -> subprocess.Popen[str]:
    """A process that runs ``code`` (which opens something on the mount), says "ready"
    and then waits for its stdin to close."""
    proc = subprocess.Popen(
        [sys.executable, "-c", f"{code}\nimport sys\nprint('ready', flush=True)\nsys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def _release(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(10)


def test_idle_mount_drains_at_once(live: Live) -> None:
    result = _drain(live.mount, timeout=0)
    assert result.returncode == 0, result.stderr
    assert "is idle" in result.stderr


@pytest.mark.parametrize(
    "code",
    ["f = open({path!r}, 'rb'); f.read(10)", "import os; os.chdir({dir!r})"],
    ids=["open-file", "cwd"],
)
def test_busy_mount_waits_then_times_out(live: Live, code: str) -> None:
    path = live.mount / "demo" / "v1" / "a.bin"
    holder = _holder(code.format(path=str(path), dir=str(path.parent)))
    try:
        result = _drain(live.mount, timeout=0.5)
        assert result.returncode == 1, result.stderr
        assert f"pid {holder.pid} (python" in result.stderr
        assert "still busy after" in result.stderr
    finally:
        _release(holder)
    result = _drain(live.mount, timeout=0)
    assert result.returncode == 0, result.stderr


def test_drain_returns_when_the_holder_closes(live: Live) -> None:
    holder = _holder(f"f = open({str(live.mount / 'demo' / 'v1' / 'b.txt')!r}, 'rb')")
    drain = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "deploy.drain",
            f"--mount={live.mount}",
            "--timeout=60",
            "--interval=0.1",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            drain.wait(1.0)  # still waiting: the file is open
    finally:
        _release(holder)
    assert drain.wait(30) == 0
    assert drain.stderr is not None and "is idle" in drain.stderr.read()


def test_not_a_mount_and_bad_arguments(tmp_path: Path) -> None:
    assert _drain(tmp_path, timeout=0).returncode == 0  # nothing mounted: nothing to protect
    bad = subprocess.run(
        [sys.executable, "-m", "deploy.drain", f"--mount={tmp_path}", "--interval=0"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "error:" in bad.stderr
