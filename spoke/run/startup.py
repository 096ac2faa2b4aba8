"""What the supervisor's start-up checks and counts, apart from its life cycle: the one
error a start-up fails with, the mountpoint check, which strata mount processes serve a
mountpoint, the restart backoff, and the cache directory's remount and hand-over counters
(read by the daemon's metrics, :class:`spoke.metrics.MountRestarts`).
"""

from __future__ import annotations

import errno
import logging
import os
import time
from pathlib import Path

from spoke.disk.layout import CacheLayout
from spoke.disk.mountinfo import is_mounted, lazy_unmount
from spoke.run.processes import cmdline, read_pid
from strata_local.atomic import write_atomic

log = logging.getLogger(__name__)

BACKOFF_FIRST = 0.5  # seconds before the first retry of a failed restart
BACKOFF_MAX = 30.0  # most seconds between retries
STABLE_AFTER = 10.0  # a child up this long resets its backoff


class StartupError(Exception):
    """The spoke could not start; the message is the one-line reason."""


def check_mountpoint(path: Path) -> None:
    """Make sure ``path`` can be mounted on; a stale FUSE mount there is cleaned up.

    Raises:
        StartupError: missing, not a directory, or busy with a live mount.
    """
    try:
        os.stat(path)
    except OSError as err:
        if err.errno == errno.ENOTCONN:  # a dead FUSE daemon left its mount behind
            log.warning("cleaning up stale mount at %s", path)
            lazy_unmount(path)
        elif err.errno == errno.ENOENT:
            raise StartupError(f"mountpoint {path} does not exist") from None
        else:
            raise StartupError(f"mountpoint {path}: {err.strerror}") from None
    if not path.is_dir():
        raise StartupError(f"mountpoint {path} is not a directory")
    if is_mounted(path):
        owners = mount_processes(path)
        by = f" (strata mount pid {', '.join(map(str, owners))})" if owners else ""
        raise StartupError(
            f"mountpoint {path} is busy: something other than this cache dir's mount is "
            f"mounted there{by}"
        )


def mount_processes(path: Path) -> list[int]:
    """Pids of strata mount processes serving ``path`` (by their command lines)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            args = cmdline(int(entry.name)) or []
            if "fusemount" in args and args[-1:] == [str(path)]:
                pids.append(int(entry.name))
    return sorted(pids)


class Restarts:
    """Backoff of one child's restarts: 0.5 s doubling to 30 s, reset once it stays up."""

    def __init__(self) -> None:
        self.delay = 0.0
        self.next_try = 0.0
        self.started = 0.0

    def due(self) -> bool:
        return time.monotonic() >= self.next_try

    def failed(self) -> float:
        self.delay = min(max(self.delay * 2, BACKOFF_FIRST), BACKOFF_MAX)
        self.next_try = time.monotonic() + self.delay
        return self.delay

    def up(self) -> None:
        self.started = time.monotonic()

    def died(self) -> None:
        if time.monotonic() - self.started >= STABLE_AFTER:
            self.delay = 0.0
        self.next_try = time.monotonic() + (self.delay or BACKOFF_FIRST / 5)


def count_mount_restarts(layout: CacheLayout) -> int:
    """How many times a supervisor of this cache directory has remounted a mount that died
    (kept in ``CACHE_DIR/mount-restarts`` across supervisors and daemons)."""
    return read_pid(layout.mount_restarts_file) or 0


def count_mount_restart(layout: CacheLayout, counter: Path | None = None) -> None:
    """Count one remount, or one hand-over with ``layout.mount_handovers_file``
    (atomically: temp file + rename)."""
    path = counter or layout.mount_restarts_file
    write_atomic(path, f"{(read_pid(path) or 0) + 1}\n".encode())
