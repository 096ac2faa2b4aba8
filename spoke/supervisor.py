"""``strata-spoke run``: start the daemon and the mount as two processes and keep them up.

Process model (DESIGN.md): the daemon and the mount are separate processes so that a
stall or crash in the daemon never takes the mount down. The supervisor starts the daemon,
waits until it serves, starts the mount, waits until the kernel shows it mounted, and then
watches both: a daemon that dies is restarted (the mount's misses wait for it); a mount
that dies is lazily unmounted and mounted again. SIGINT/SIGTERM stop the mount first
(unmount), then the daemon.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from spoke import lock
from spoke.config import SpokeSettings
from spoke.layout import CacheLayout

log = logging.getLogger(__name__)

READY_TIMEOUT = 30.0  # seconds for a child to come up
STOP_TIMEOUT = 10.0  # seconds for a child to stop after SIGTERM


class StartupError(Exception):
    """The spoke could not start; the message is the one-line reason."""


def mounted_paths() -> set[str]:
    """Mountpoints currently in this process's mount namespace (from /proc/self/mountinfo)."""
    paths: set[str] = set()
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 4:
                paths.add(fields[4].encode().decode("unicode_escape"))
    return paths


def is_mounted(path: Path) -> bool:
    """True when ``path`` (absolute and already resolved) is a mountpoint.

    The path is compared as a string and never stat'ed: a hung FUSE mount there must not
    hang the caller. Resolve it once, before mounting.
    """
    return str(path) in mounted_paths()


def resolve_mountpoint(path: Path) -> Path:
    """``path`` made absolute with its parent's symlinks resolved, without touching ``path``
    itself (a dead FUSE mount there answers every stat with ENOTCONN)."""
    absolute = Path(os.path.abspath(path))
    return absolute.parent.resolve() / absolute.name


def lazy_unmount(path: Path) -> None:
    """Detach a (possibly dead) FUSE mount: ``fusermount3 -u -z``."""
    subprocess.run(
        ["fusermount3", "-u", "-z", str(path)],
        check=False,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


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
        raise StartupError(f"mountpoint {path} is busy: something is already mounted there")


class Supervisor:
    """Runs and watches the daemon and mount processes of one spoke.

    Args:
        settings: validated spoke settings (``mount`` must be set).
        log_level: passed to both children.
    """

    def __init__(self, settings: SpokeSettings, log_level: str = "INFO") -> None:
        if settings.mount is None:
            raise StartupError("--mount is required")
        self.settings = settings
        self.mountpoint = resolve_mountpoint(settings.mount)
        self.layout = CacheLayout(settings.cache_dir.resolve())
        self.log_level = log_level
        self.daemon: subprocess.Popen[bytes] | None = None
        self.mount: subprocess.Popen[bytes] | None = None
        self._stop = False
        self._lock: int | None = None  # CACHE_DIR/spoke.lock while running

    def _daemon_cmd(self) -> list[str]:
        s = self.settings
        cmd = [sys.executable, "-m", "spoke", "daemon", "--hub", s.hub]
        cmd += ["--cache-dir", str(self.layout.root), "--cache-size", str(int(s.cache_size))]
        cmd += ["--admin", s.admin, "--policy", s.policy]
        cmd += ["--miss-deadline", str(s.miss_deadline), "--log-level", self.log_level]
        if s.admin_token_file is not None:
            cmd += ["--admin-token-file", str(s.admin_token_file.resolve())]
        cmd += ["--background-fill", s.background_fill]
        if s.fill_rate is not None:
            cmd += ["--fill-rate", str(int(s.fill_rate))]
        if s.mesh is not None:
            cmd += s.mesh.to_args()
        return [*cmd, "--mount", str(self.mountpoint)]

    def _mount_cmd(self) -> list[str]:
        s = self.settings
        cmd = [sys.executable, "-m", "fusemount", "--cache-dir", str(self.layout.root)]
        cmd += ["--miss-deadline", str(s.miss_deadline), "--log-level", self.log_level]
        cmd += ["--read-ahead-kb", str(s.read_ahead_kb)]
        if s.allow_other:
            cmd.append("--allow-other")
        return [*cmd, str(self.mountpoint)]

    def _start_daemon(self) -> None:
        self.layout.admin_url_file.unlink(missing_ok=True)
        self.daemon = subprocess.Popen(self._daemon_cmd(), start_new_session=True)
        self._wait(self.daemon, "daemon", self.layout.admin_url_file.exists)

    def _start_mount(self) -> None:
        self.mount = subprocess.Popen(self._mount_cmd(), start_new_session=True)
        self._wait(self.mount, "mount", lambda: is_mounted(self.mountpoint))

    def _wait(self, proc: subprocess.Popen[bytes], what: str, ready: object) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while not ready():  # type: ignore[operator]
            if proc.poll() is not None:
                raise StartupError(f"{what} exited with status {proc.returncode} during start-up")
            if self._stop:
                raise StartupError(f"interrupted while the {what} was starting")
            if time.monotonic() > deadline:
                raise StartupError(f"{what} not ready after {READY_TIMEOUT:.0f} s")
            time.sleep(0.05)

    def admin_url(self) -> str:
        """The admin API's base URL (as written by the daemon)."""
        return self.layout.admin_url_file.read_text().strip()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stop = True

    def run(self) -> int:
        """Start both processes, watch them until a signal, stop them. Returns the exit code.

        Raises:
            StartupError: the spoke could not start (one-line reason); nothing is left running.
        """
        try:
            self.layout.root.mkdir(parents=True, exist_ok=True)
            self._lock = lock.hold(self.layout.spoke_lock, "strata-spoke run")
        except lock.CacheInUse as err:
            raise StartupError(str(err.strerror)) from None
        except OSError as err:
            raise StartupError(f"cache dir {self.layout.root}: {err.strerror}") from None
        check_mountpoint(self.mountpoint)
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self._start_daemon()
            self._start_mount()
            print(
                f"strata-spoke: mounted {self.mountpoint} (hub {self.settings.hub}, "
                f"cache {self.layout.root}, admin {self.admin_url()})",
                flush=True,
            )
            self._watch()
            return 0
        finally:
            self.shutdown()
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _watch(self) -> None:
        while not self._stop:
            time.sleep(0.2)
            if self._stop:
                break
            if self.daemon is not None and self.daemon.poll() is not None:
                log.error("daemon exited with status %s; restarting", self.daemon.returncode)
                time.sleep(0.5)
                self._start_daemon()
            if self.mount is not None and self.mount.poll() is not None:
                log.error("mount exited with status %s; remounting", self.mount.returncode)
                lazy_unmount(self.mountpoint)
                self._start_mount()

    def shutdown(self) -> None:
        """Unmount, then stop the daemon; safe to call more than once."""
        if self.mount is not None:
            _terminate(self.mount)
            self.mount = None
        if is_mounted(self.mountpoint):
            lazy_unmount(self.mountpoint)
        if self.daemon is not None:
            _terminate(self.daemon)
            self.daemon = None
        self.layout.mount_pid_file.unlink(missing_ok=True)  # the mount's, now stopped
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(STOP_TIMEOUT)
