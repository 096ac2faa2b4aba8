"""The supervisor's two kinds of children, started and held: the daemon, and the mount
processes with the FUSE connection they hand over (:mod:`spoke.disk.handover`).

:class:`Children` is the state and the start-up half of :class:`spoke.run.supervisor.Supervisor`
(which adds the life cycle: watch, restart, re-exec, succession, stop): how each child is
started with its settings file or adopted from a supervisor that was killed, how a new
mount's connection is taken and held, how a successor mount process resumes it after the
one before ended or handed it over.
Everything here runs on the supervisor's one thread.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time

from pydantic import BaseModel

from spoke.disk import handover
from spoke.disk.layout import CacheLayout
from spoke.disk.mountinfo import is_mounted, lazy_unmount, resolve_mountpoint
from spoke.run.process import stop_process
from spoke.run.processes import Process, find, find_daemon, read_pid, same_settings
from spoke.run.schema import MountSettings, resolved, settings_file, write_settings
from spoke.run.settings import SpokeSettings
from spoke.run.startup import Restarts, StartupError, count_mount_restart, mount_processes
from spoke.run.workers import MountWorkers, stop_reading

log = logging.getLogger(__name__)

READY_TIMEOUT = 30.0  # seconds for a child to come up
STOP_TIMEOUT = 10.0  # seconds for a child to stop after SIGTERM
HANDOVER_TIMEOUT = 10.0  # seconds for a mount to hand its connection over or resume it


class Children:
    """The daemon and mount processes of one spoke, and the FUSE connection held for them.

    Nineteen methods for two processes (command line, start, adopt, restart each) and the
    FUSE connection they share (take, hand over, resume, release), which must change
    together: a mount restarted without its connection's hand-over would be a new mount.

    Args:
        settings: validated spoke settings (``mount`` must be set); the children get them
            as files (:func:`spoke.run.settings.write_settings`), never as flags.

    Raises:
        StartupError: ``mount`` is not set.
    """

    def __init__(self, settings: SpokeSettings) -> None:
        if settings.mount is None:
            raise StartupError("--mount is required")
        self.mountpoint = resolve_mountpoint(settings.mount)
        self.layout = CacheLayout(settings.cache_dir.resolve())
        # what both children run with: these settings, every path absolute
        self.settings = resolved(settings, cache_dir=self.layout.root, mount=self.mountpoint)
        self.daemon: Process | None = None
        self.mount: Process | None = None
        self._stop = False
        self._lock: int | None = None  # CACHE_DIR/spoke.lock while running
        self._mounted = False  # a mount of ours was (or is) on the mountpoint
        self._daemon_restarts = Restarts()
        self._mount_restarts = Restarts()
        # the mount's FUSE connection, held so that a successor can resume it: our copy of
        # its /dev/fuse descriptor and its INIT request (None: not held, remount instead)
        self._fuse: tuple[int, bytes] | None = None
        self._handover_off = handover.unavailable_reason(self.settings.mount_handover)
        self.mount_workers = handover.default_workers(self.settings.mount_workers)
        self.workers = MountWorkers(  # workers 1..N-1; self.mount is worker 0
            self._spawn_worker,
            time.monotonic,
            lambda: count_mount_restart(self.layout, self.layout.mount_handovers_file),
        )

    def mount_settings(self) -> MountSettings:
        """The part of the settings the mount process runs with."""
        return MountSettings(**self.settings.model_dump(include=set(MountSettings.model_fields)))

    def _daemon_cmd(self) -> list[str]:
        path, _ = settings_file(self.settings, self.layout.private_dir, "daemon")
        return [sys.executable, "-m", "spoke", "daemon", "--settings", str(path)]

    def _mount_cmd(self) -> list[str]:
        path, _ = settings_file(self.mount_settings(), self.layout.private_dir, "mount")
        return [sys.executable, "-m", "fusemount", "--settings", str(path), str(self.mountpoint)]

    def _hand(self, settings: BaseModel, role: str) -> None:
        """Write the settings file (owner-only, private) the child ``role`` starts with."""
        try:
            write_settings(settings, self.layout.private_dir, role)
        except OSError as err:
            raise StartupError(f"{role} settings in {self.layout.private_dir}: {err}") from None

    def _start_daemon(self) -> None:
        self.layout.admin_url_file.unlink(missing_ok=True)
        self._hand(self.settings, "daemon")
        self.daemon = subprocess.Popen(self._daemon_cmd(), start_new_session=True)
        self._wait(self.daemon, "daemon", self.layout.admin_url_file.exists)
        self._daemon_restarts.up()

    def _start_mount(self, resume: bool = False) -> None:
        """Start a mount process: a new mount, or (``resume``) a successor on the held
        connection, which must say it serves within :data:`HANDOVER_TIMEOUT`; then the
        other mount workers, when more are asked for and the connection is held."""
        assert not resume or self._fuse is not None
        if not resume:  # a new connection: no worker of an earlier one may write its records
            self.workers.stop(terminate)
        self.mount = self._spawn_mount(0, self._fuse[0] if resume and self._fuse else None)
        self._mount_restarts.up()
        if self._fuse is not None and not resume:
            self.workers.start(self.mount_workers, self._fuse[0])

    def _spawn_worker(self, index: int, fd: int) -> Process:
        """Start mount worker ``index`` on its clone ``fd`` (:class:`MountWorkers`)."""
        return self._spawn_mount(index, fd)

    def _spawn_mount(self, index: int, resume_fd: int | None) -> Process:
        """Start mount worker ``index``: a new mount (``resume_fd`` None), or a successor
        resuming the connection on ``resume_fd``. Returns it once it serves.

        Raises:
            StartupError: it exited, did not come up, or did not resume in time.
        """
        self._hand(self.mount_settings(), "mount")
        env, fds = dict(os.environ), []
        env[handover.WORKER_ENV] = str(index)
        env[handover.WORKERS_ENV] = str(1 if self._handover_off else self.mount_workers)
        resume = resume_fd is not None
        control = None
        if not self._handover_off:
            control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            env[handover.HANDOVER_ENV] = str(theirs.fileno())
            fds.append(theirs.fileno())
        if resume_fd is not None:
            assert self._fuse is not None
            env[handover.RESUME_ENV] = str(resume_fd)
            env[handover.INIT_ENV] = self._fuse[1].hex()
            fds.append(resume_fd)
        try:
            cmd = self._mount_cmd()
            proc = subprocess.Popen(cmd, start_new_session=True, env=env, pass_fds=fds)
        finally:
            if control is not None:
                theirs.close()
        self._mounted = True
        try:
            self._wait(proc, "mount", lambda: is_mounted(self.mountpoint))
            if control is not None:
                self._take_connection(control, proc, resume)
        finally:
            if control is not None:
                control.close()
        return proc

    def _take_connection(self, control: socket.socket, proc: Process, resume: bool) -> None:
        """Hold the new mount's connection (or hear that a successor resumed it)."""
        got = handover.receive(control, HANDOVER_TIMEOUT)
        if resume:
            if got is not True:
                terminate(proc)
                raise StartupError("the successor did not resume the FUSE connection")
            return
        if isinstance(got, tuple):
            self._release_connection()
            self._fuse = got
            log.info("holding the mount's FUSE connection for hand-over")
        elif isinstance(got, str):
            log.warning("mount hand-over off: %s", got)
        else:
            log.warning("mount hand-over off: the mount did not hand over its connection")

    def _release_connection(self) -> None:
        if self._fuse is not None:
            os.close(self._fuse[0])
            self._fuse = None

    def _resume_mount(self) -> bool:
        """Start a successor on the held connection after the mount process ended: the
        kernel first queues again what the dead one read and never answered. False (the
        connection released) when that cannot be done: remount then."""
        assert self._fuse is not None
        try:
            handover.notify_resend(self._fuse[0])
        except OSError as err:
            log.error("mount hand-over off: FUSE_NOTIFY_RESEND refused (%s); remounting", err)
            self._handover_off = f"FUSE_NOTIFY_RESEND refused: {err.strerror}"
        else:
            try:
                self._start_mount(resume=True)
                count_mount_restart(self.layout, self.layout.mount_handovers_file)
                return True
            except StartupError as err:
                log.error("mount hand-over failed: %s; remounting", err)
        self.mount = None
        self.workers.stop(terminate)  # they serve the connection being given up
        lazy_unmount(self.mountpoint)
        self._release_connection()
        return False

    def _hand_over_mount(self) -> None:
        """SIGHUP with a held connection: the mount process stops reading it and exits
        (SIGUSR2), and a successor running the code on disk now resumes it."""
        if self.mount is None or self._fuse is None:
            return
        stop_reading(self.mount, HANDOVER_TIMEOUT, "the mount")
        self.mount = None
        if not self._resume_mount():
            self._start_mount()
            return
        self.workers.hand_over(HANDOVER_TIMEOUT, self._resend)

    def _wait(self, proc: Process, what: str, ready: object) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while not ready():  # type: ignore[operator]
            if proc.poll() is not None:
                raise StartupError(f"{what} exited with status {proc.poll()} during start-up")
            if self._stop:
                terminate(proc)
                raise StartupError(f"interrupted while the {what} was starting")
            if time.monotonic() > deadline:
                terminate(proc)
                raise StartupError(f"{what} not ready after {READY_TIMEOUT:.0f} s")
            time.sleep(0.05)

    def admin_url(self) -> str:
        """The admin API's base URL (as written by the daemon), or ``"unknown"`` when the
        file is gone (a message must not stop a spoke that serves)."""
        try:
            return self.layout.admin_url_file.read_text().strip()
        except OSError:
            return "unknown"

    def _adopt(self) -> str:
        """Take over a live daemon and mount of this cache directory (their supervisor was
        killed, or this one re-executed); stop those started with other settings.

        Returns:
            What was done, for the operator ("" when nothing was found).
        """
        done: list[str] = []
        expected = self._daemon_cmd()
        daemon, args = find_daemon(self.layout.daemon_lock, expected)
        if daemon is not None and args is not None:
            if same_settings(args, expected) and self.layout.admin_url_file.exists():
                self.daemon = daemon
                self._daemon_restarts.up()
                done.append(f"adopted daemon pid {daemon.pid}")
            else:
                terminate(daemon)
                done.append(f"stopped daemon pid {daemon.pid} (other settings)")
        expected = self._mount_cmd()
        mount, args = find(read_pid(self.layout.mount_pid_file), expected)
        if mount is not None and args is not None:
            if same_settings(args, expected) and is_mounted(self.mountpoint):
                self.mount = mount
                self._mounted = True
                self._mount_restarts.up()
                done.append(f"adopted mount pid {mount.pid}")
                known = {mount.pid, *self.workers.pids()}
                self.workers.adopt([p for p in mount_processes(self.mountpoint) if p not in known])
            else:
                terminate(mount)
                done.append(f"stopped mount pid {mount.pid} (other settings)")
        if not done:
            return ""
        if len(done) == 2 and done[0].split()[0] == done[1].split()[0]:  # the same verb
            done[1] = done[1].split(" ", 1)[1]
        message = " and ".join(done) + f" of {self.layout.root}"
        log.warning("%s", message)
        return message

    def _restart_daemon(self) -> None:
        if self.daemon is not None:
            terminate(self.daemon)
        self._start_daemon()

    def _release(self) -> None:
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def _resend(self, fd: int) -> None:
        try:
            handover.notify_resend(fd)
        except OSError as err:
            log.error("FUSE_NOTIFY_RESEND refused (%s): a dead worker's requests may fail", err)


def terminate(proc: Process) -> None:
    """Stop a child: SIGTERM, then SIGKILL after :data:`STOP_TIMEOUT` seconds."""
    stop_process(proc, STOP_TIMEOUT, group=False)
