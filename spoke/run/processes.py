"""Handles on a spoke's daemon and mount processes, whether this supervisor started them or
found them already running (adopted after a supervisor was killed, or across its re-exec).

A found process is identified by its pid file (``mount.pid``) or the holder of its lock
(``daemon.lock``), then checked against ``/proc/PID/cmdline`` (the right program, for this
cache directory), then held by a pidfd (``pidfd_open(2)``, Linux 5.3), so a pid reused by
an unrelated process after it exits can never be signalled.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
from pathlib import Path
from typing import Protocol

from spoke.run import lock


class Process(Protocol):
    """What the supervisor needs of a child: :class:`subprocess.Popen` or :class:`Adopted`."""

    @property
    def pid(self) -> int:
        """Its process id."""

    def poll(self) -> int | None:
        """None while it runs, else its exit status."""

    def send_signal(self, sig: int) -> None:
        """Signal it (nothing if it has exited)."""

    def wait(self, timeout: float | None = None) -> int:
        """Wait for it to exit. Raises subprocess.TimeoutExpired."""

    def kill(self) -> None:
        """SIGKILL it."""


UNKNOWN_STATUS = -255
"""Exit status reported for an adopted process that is not our child (only its parent may
learn the real one)."""


class Adopted:
    """A running process this supervisor did not start, held by a pidfd.

    Args:
        pid: its process id.

    Raises:
        ProcessLookupError: it has already exited.
    """

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self._fd: int | None = os.pidfd_open(pid)
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        """Its process id."""
        return self._pid

    def poll(self) -> int | None:
        """None while it runs; its exit status once it has exited (reaped if it is our
        child, as after the supervisor's re-exec; :data:`UNKNOWN_STATUS` if not)."""
        if self.returncode is not None:
            return self.returncode
        assert self._fd is not None
        if not select.select([self._fd], [], [], 0)[0]:
            return None
        self.returncode = UNKNOWN_STATUS
        with contextlib.suppress(ChildProcessError):
            pid, status = os.waitpid(self._pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        os.close(self._fd)
        self._fd = None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Signal it through its pidfd (nothing if it has exited)."""
        if self.poll() is None and self._fd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._fd, sig)

    def kill(self) -> None:
        """SIGKILL it."""
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        """Wait for it to exit.

        Raises:
            subprocess.TimeoutExpired: still running after ``timeout`` seconds.
        """
        if self.poll() is None and self._fd is not None:
            select.select([self._fd], [], [], timeout)
        status = self.poll()
        if status is None:
            raise subprocess.TimeoutExpired(f"pid {self._pid}", timeout or 0.0)
        return status


def cmdline(pid: int) -> list[str] | None:
    """The command line of process ``pid`` (None when it is gone or unreadable)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0")[:-1]]


def read_pid(path: Path) -> int | None:
    """The pid written in ``path`` (None when missing or malformed)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def find(pid: int | None, expected: list[str]) -> tuple[Adopted | None, list[str] | None]:
    """Hold process ``pid`` if it runs and is the program ``expected`` names (the same
    ``-m`` module and ``--cache-dir``; the interpreter path may differ).

    Returns:
        The held process (None when absent or another program) and its command line
        (None when absent), so the caller can tell whether its settings match.
    """
    if pid is None:
        return None, None
    args = cmdline(pid)
    if args is None or not _same_program(args, expected):
        return None, None
    try:
        return Adopted(pid), args
    except ProcessLookupError:
        return None, None


def find_daemon(layout_lock: Path, expected: list[str]) -> tuple[Adopted | None, list[str] | None]:
    """The live daemon holding ``daemon.lock``, if it is the program ``expected`` names."""
    return find(lock.holder(layout_lock), expected)


def _same_program(args: list[str], expected: list[str]) -> bool:
    def key(cmd: list[str]) -> tuple[list[str], str | None]:
        at = cmd.index("-m") + 1 if "-m" in cmd else len(cmd)
        module = cmd[at : at + 2] if cmd[at : at + 1] == ["spoke"] else cmd[at : at + 1]
        return module, _cache_dir(cmd)

    return key(args) == key(expected)


def _cache_dir(cmd: list[str]) -> str | None:
    """The cache directory a child's command line names: its ``--cache-dir``, or the one
    its ``--settings`` file lies in (``CACHE_DIR/.grpc/ROLE-DIGEST.json``)."""
    if "--cache-dir" in cmd[:-1]:
        return cmd[cmd.index("--cache-dir") + 1]
    if "--settings" in cmd[:-1]:
        return str(Path(cmd[cmd.index("--settings") + 1]).parent.parent)
    return None


def same_settings(args: list[str], expected: list[str]) -> bool:
    """True when two command lines differ at most in the interpreter's path."""
    return args[1:] == expected[1:]
