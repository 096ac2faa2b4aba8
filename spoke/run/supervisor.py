"""``strata-spoke run``: start the daemon and the mount as two processes and keep them up.

Process model (DESIGN.md): the daemon and the mount are separate processes so that a
stall or crash in the daemon never takes the mount down. The supervisor starts the daemon,
waits until it serves, starts the mount, waits until the kernel shows it mounted, and then
watches both: a daemon that dies is restarted (the mount's misses wait for it); a mount
that dies is succeeded by a new mount process on the same FUSE connection, which the
supervisor holds (mount hand-over, :mod:`spoke.disk.handover`: readers holding open files
see a delay, not ENOTCONN), or, where hand-over is off or fails, lazily unmounted and
mounted again. With ``--mount-workers N`` the held connection is cloned for N-1 more mount
processes, each resumed the same way and succeeded the same way when it dies
(:mod:`spoke.run.workers`). A restart that fails is retried with exponential backoff for
as long as the spoke is asked to serve.

Signals: SIGINT/SIGTERM stop the mount first (unmount), then the daemon. SIGHUP upgrades
in place: the supervisor re-executes itself (new code), restarts the daemon (new code;
misses wait for it) and hands the mount's connection to a new mount process (new code;
without hand-over the mount process is kept: readers holding open files notice nothing).
SIGUSR1 makes the supervisor exit and leave both serving, for the next ``strata-spoke run``
on the cache directory, which adopts them, as it adopts the daemon and mount of a
supervisor that was killed (:mod:`spoke.run.processes`). Daemon or mount processes of the
cache directory started with other settings are stopped cleanly and started anew.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from pydantic import BaseModel

from spoke.disk import handover
from spoke.disk.encryption import EncryptionError, check_cache_key
from spoke.disk.hardening import (
    UnsafeDirectory,
    private_socket_dir,
    private_umask,
    secure_cache_dir,
)
from spoke.disk.layout import CacheLayout
from spoke.disk.mountinfo import is_mounted, lazy_unmount, resolve_mountpoint
from spoke.run import lock
from spoke.run.process import stop_process
from spoke.run.processes import Process, cmdline, find, find_daemon, read_pid, same_settings
from spoke.run.schema import MountSettings, resolved, settings_file, write_settings
from spoke.run.settings import SpokeSettings
from spoke.run.workers import MountWorkers, stop_reading

log = logging.getLogger(__name__)

READY_TIMEOUT = 30.0  # seconds for a child to come up
STOP_TIMEOUT = 10.0  # seconds for a child to stop after SIGTERM
BACKOFF_FIRST = 0.5  # seconds before the first retry of a failed restart
BACKOFF_MAX = 30.0  # most seconds between retries
STABLE_AFTER = 10.0  # a child up this long resets its backoff
RELOAD_ENV = "STRATA_SPOKE_RELOADED"  # set across the SIGHUP re-exec: restart the daemon
FUSE_ENV = "STRATA_SPOKE_FUSE"  # across the re-exec: "FD INIT-HEX" of the held connection
HANDOVER_TIMEOUT = 10.0  # seconds for a mount to hand its connection over or resume it


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


class _Restarts:
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


class Supervisor:
    """Runs and watches the daemon and mount processes of one spoke.

    Its 19 methods are one life cycle — start or adopt each child, wait for it to be ready,
    watch and restart it with backoff, re-exec on SIGHUP, stop or leave both — around one
    piece of state (the two children, the lock, the restart clocks), so they stay together;
    what needs no such state lives beside it (:mod:`spoke.run.processes`,
    :mod:`spoke.run.process`, :mod:`spoke.disk.mountinfo`).

    Args:
        settings: validated spoke settings (``mount`` must be set); the children get them
            as files (:func:`spoke.run.settings.write_settings`), never as flags.
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
        self._leave = False  # SIGUSR1: exit, leaving both serving
        self._reload = False  # SIGHUP: re-exec, keep the mount, restart the daemon
        self._lock: int | None = None  # CACHE_DIR/spoke.lock while running
        self._mounted = False  # a mount of ours was (or is) on the mountpoint
        self._daemon_restarts = _Restarts()
        self._mount_restarts = _Restarts()
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
            self.workers.stop(_terminate)
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
                _terminate(proc)
                raise StartupError("the successor did not resume the FUSE connection")
            return
        if isinstance(got, tuple):
            self._release_connection()
            self._fuse = got
            log.info("holding the mount's FUSE connection for hand-over")
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
        self.workers.stop(_terminate)  # they serve the connection being given up
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
                _terminate(proc)
                raise StartupError(f"interrupted while the {what} was starting")
            if time.monotonic() > deadline:
                _terminate(proc)
                raise StartupError(f"{what} not ready after {READY_TIMEOUT:.0f} s")
            time.sleep(0.05)

    def admin_url(self) -> str:
        """The admin API's base URL (as written by the daemon)."""
        return self.layout.admin_url_file.read_text().strip()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            self._reload = True
        elif signum == signal.SIGUSR1:
            self._leave = True
        self._stop = True

    def run(self) -> int:
        """Start (or adopt) both processes, watch them until a signal, then stop them, leave
        them serving (SIGUSR1) or re-execute with them (SIGHUP). Returns the exit code.

        Raises:
            StartupError: the spoke could not start (one-line reason); nothing is left running.
        """
        private_umask()  # the cache dir, pid files and both children: owner only
        try:
            self.layout.root.mkdir(parents=True, exist_ok=True)
            secure_cache_dir(self.layout)  # before anything is read or written there
            private_socket_dir(self.layout.private_dir)  # where the children's settings go
            self._lock = lock.hold(self.layout.spoke_lock, "strata-spoke run")
        except UnsafeDirectory as err:
            raise StartupError(str(err)) from None
        except lock.CacheInUse as err:
            raise StartupError(str(err.strerror)) from None
        except OSError as err:
            raise StartupError(f"cache dir {self.layout.root}: {err.strerror}") from None
        reloaded = bool(os.environ.pop(RELOAD_ENV, None))
        if self.mount_workers > 1 and self._handover_off:
            log.warning("one mount worker, not %d: workers need hand-over (%s)",
                        self.mount_workers, self._handover_off)  # fmt: skip
            self.mount_workers = 1
        handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)
        previous = {s: signal.signal(s, self._on_signal) for s in handled}
        try:
            self._check_encryption()
            if reloaded:
                self.workers.from_environment()
            adopted = self._adopt()
            if self.mount is None:
                check_mountpoint(self.mountpoint)
            if self.daemon is None:
                self._start_daemon()
            elif reloaded:
                adopted = adopted.replace("daemon", "mount; restarted the daemon", 1)
                self._restart_daemon()
            if reloaded:
                self._restore_connection()
                if self.mount is not None and self._fuse is not None:
                    self._hand_over_mount()
                    adopted += "; handed the mount's connection to a new mount process"
            if self.mount is None:
                self._start_mount()
            if adopted:
                print(f"strata-spoke: {adopted}", flush=True)
            print(
                f"strata-spoke: mounted {self.mountpoint} (hub {self.settings.hub}, "
                f"cache {self.layout.root}, admin {self.admin_url()})",
                flush=True,
            )
            self._watch()
            return 0
        finally:
            if self._reload:
                self._reexec()
            if self._leave:
                self._release()
                print(
                    f"strata-spoke: left daemon pid {_pid(self.daemon)} and mount pid "
                    f"{' '.join([_pid(self.mount), *map(str, self.workers.pids())])} "
                    f"serving; the next strata-spoke run on "
                    f"{self.layout.root} adopts them",
                    flush=True,
                )
            else:
                self.shutdown()
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _check_encryption(self) -> None:
        """Refuse a cache dir written with another encryption key, or with one when none is
        given (before anything starts; the daemon records a new key itself)."""
        s = self.settings
        try:
            check_cache_key(self.layout, s.block_cipher(), s.encryption_key_file, record=False)
        except EncryptionError as err:
            raise StartupError(str(err)) from None

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
                _terminate(daemon)
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
                _terminate(mount)
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
            _terminate(self.daemon)
        self._start_daemon()

    def _reexec(self) -> None:
        """Replace this process with a fresh ``strata-spoke run`` (the code on disk now),
        leaving the daemon and mount running for it to adopt."""
        log.warning("SIGHUP: re-executing the supervisor; the mount stays, the daemon restarts")
        self._release()
        os.environ[RELOAD_ENV] = "1"
        if self._fuse is not None:  # the held connection crosses the exec
            os.set_inheritable(self._fuse[0], True)
            os.environ[FUSE_ENV] = f"{self._fuse[0]} {self._fuse[1].hex()}"
            self.workers.to_environment()
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])

    def _restore_connection(self) -> None:
        """After the SIGHUP re-exec: take back the connection held before it."""
        held = os.environ.pop(FUSE_ENV, None)
        if held is None:
            return
        fd, init = held.split()
        if handover.is_fuse_device(int(fd)):
            os.set_inheritable(int(fd), False)
            self._fuse = (int(fd), bytes.fromhex(init))

    def _release(self) -> None:
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def _resend(self, fd: int) -> None:
        try:
            handover.notify_resend(fd)
        except OSError as err:
            log.error("FUSE_NOTIFY_RESEND refused (%s): a dead worker's requests may fail", err)

    def _watch(self) -> None:
        while not self._stop:
            time.sleep(0.2)
            if self._stop:
                break
            self.workers.watch(self._resend)
            if self.daemon is not None and self.daemon.poll() is not None:
                log.error("daemon exited with status %s; restarting", self.daemon.poll())
                self.daemon = None
                self._daemon_restarts.died()
            if self.daemon is None and self._daemon_restarts.due():
                self._restart(self._start_daemon, self._daemon_restarts, "daemon")
            if self.mount is not None and self.mount.poll() is not None:
                status = self.mount.poll()
                self.mount = None
                if self._fuse is not None and not self._stop:
                    log.error("mount exited with status %s; resuming its connection", status)
                    if self._resume_mount():
                        continue
                else:
                    log.error("mount exited with status %s; remounting", status)
                self._mount_restarts.died()
            if self.mount is None and self._mount_restarts.due() and not self._stop:
                lazy_unmount(self.mountpoint)
                if self._restart(self._start_mount, self._mount_restarts, "mount"):
                    count_mount_restart(self.layout)

    def _restart(self, start: object, backoff: _Restarts, what: str) -> bool:
        """One restart attempt; a failure is logged and retried after a backoff (never an
        exit while the spoke is asked to serve)."""
        try:
            start()  # type: ignore[operator]
        except StartupError as err:
            if self._stop:
                return False
            log.error("%s restart failed: %s; retrying in %.1f s", what, err, backoff.failed())
            return False
        return True

    def shutdown(self) -> None:
        """Unmount, then stop the daemon; safe to call more than once."""
        self.workers.stop(_terminate)
        if self.mount is not None:
            _terminate(self.mount)
            self.mount = None
        if self._mounted and is_mounted(self.mountpoint):  # never another spoke's mount
            lazy_unmount(self.mountpoint)
        self._release_connection()  # after the unmount: the connection ends with it
        if self.daemon is not None:
            _terminate(self.daemon)
            self.daemon = None
        self.layout.mount_pid_file.unlink(missing_ok=True)  # the mount's, now stopped
        self._release()


def count_mount_restarts(layout: CacheLayout) -> int:
    """How many times a supervisor of this cache directory has remounted a mount that died
    (kept in ``CACHE_DIR/mount-restarts`` across supervisors and daemons)."""
    return read_pid(layout.mount_restarts_file) or 0


def count_mount_restart(layout: CacheLayout, counter: Path | None = None) -> None:
    """Count one remount, or one hand-over with ``layout.mount_handovers_file``
    (atomically: temp file + rename)."""
    path = counter or layout.mount_restarts_file
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{(read_pid(path) or 0) + 1}\n")
    tmp.replace(path)


def _pid(proc: Process | None) -> str:
    return str(proc.pid) if proc is not None else "-"


def _terminate(proc: Process) -> None:
    stop_process(proc, STOP_TIMEOUT, group=False)
