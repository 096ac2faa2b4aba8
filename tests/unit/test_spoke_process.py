"""Stopping a child: SIGTERM, then SIGKILL of the child or of its process group."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from spoke.run.process import stop_process
from tests.support import eventually

# product interval: each child below sleeps 60 s, the life of the process stop_process
# ends (it must outlive the test's stop, never run out by itself); nothing waits on it
IGNORES_TERM = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def _dead(pid: int) -> bool:
    """Gone, or a zombie waiting for whoever reaps orphans (proc(5): state ``Z``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


def _start(code: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    return proc


def test_a_child_that_exits_on_sigterm_is_not_killed() -> None:
    proc = _start("import time; print('ready', flush=True); time.sleep(60)")
    stop_process(proc, 10.0)
    assert proc.returncode == -15  # SIGTERM, not SIGKILL


def test_a_child_that_ignores_sigterm_is_killed_after_the_timeout() -> None:
    proc = _start(IGNORES_TERM)
    started = time.monotonic()
    stop_process(proc, 0.3, group=False)
    assert proc.returncode == -9
    assert time.monotonic() - started >= 0.3


def test_group_kill_also_stops_the_childs_children() -> None:
    code = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print('ready', flush=True); print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = _start(code)
    assert proc.stdout is not None
    grandchild = int(proc.stdout.readline())
    stop_process(proc, 0.3)
    assert proc.returncode == -9
    eventually(lambda: _dead(grandchild), "the grandchild gone after its group's SIGKILL", 10)


def test_stopping_an_exited_child_does_nothing() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(10)
    stop_process(proc, 0.1)
    assert proc.returncode == 0
