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

Succession (:mod:`spoke.run.succession`): a running supervisor listens on
``CACHE_DIR/.grpc/heir``; a new ``strata-spoke run --take-over`` on the same cache dir
(another release, another pod) takes over its lock, cache and FUSE connection there, so
the mount is never unmounted, and the old one exits (or, ``--after-succession wait``,
idles until stopped).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
from types import FrameType
from typing import Any

from spoke.disk import handover
from spoke.disk.encryption import EncryptionError, check_cache_key
from spoke.disk.hardening import (
    UnsafeDirectory,
    private_socket_dir,
    private_umask,
    secure_cache_dir,
)
from spoke.disk.mountinfo import is_mounted, lazy_unmount
from spoke.run import lock, succession
from spoke.run.children import HANDOVER_TIMEOUT, Children, terminate
from spoke.run.processes import Adopted, Process, read_pid
from spoke.run.settings import SpokeSettings
from spoke.run.startup import (
    Restarts,
    StartupError,
    check_mountpoint,
    count_mount_restart,
    mount_processes,
)

__all__ = ["StartupError", "Supervisor", "check_mountpoint", "mount_processes"]

log = logging.getLogger(__name__)

RELOAD_ENV = "STRATA_SPOKE_RELOADED"  # set across the SIGHUP re-exec: restart the daemon
FUSE_ENV = "STRATA_SPOKE_FUSE"  # across the re-exec: "FD INIT-HEX" of the held connection


class Supervisor(Children):
    """Runs and watches the daemon and mount processes of one spoke.

    Twenty-four methods: half are the successor's and predecessor's side of succession
    (:mod:`spoke.run.succession` calls them through its protocol), the rest the life
    cycle; the processes themselves are :class:`~spoke.run.children.Children`.

    The life cycle around :class:`Children`' state, start-up and adoption: watch and
    restart the children with backoff, re-exec on SIGHUP, stop or leave both, and
    succession — the predecessor's and the successor's side of
    :mod:`spoke.run.succession` (its :class:`~spoke.run.succession.Predecessor` and
    :class:`~spoke.run.succession.Successor`). What needs no such state lives beside it
    (:mod:`spoke.run.startup`, :mod:`spoke.run.processes`, :mod:`spoke.disk.mountinfo`).

    Args:
        settings: validated spoke settings (``mount`` must be set); the children get them
            as files (:func:`spoke.run.settings.write_settings`), never as flags.

    Raises:
        StartupError: ``mount`` is not set.
    """

    def __init__(self, settings: SpokeSettings) -> None:
        super().__init__(settings)
        self._leave = False  # SIGUSR1: exit, leaving both serving
        self._reload = False  # SIGHUP: re-exec, keep the mount, restart the daemon
        self._heir: succession.Listener | None = None  # where a successor asks
        self._successor: int | None = None  # the pid that took over: exit, never unmount
        self._predecessor_mount: int | None = None  # its first mount process (a successor's)
        self._terminated = False  # SIGINT or SIGTERM came

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            self._reload = True
        elif signum == signal.SIGUSR1:
            self._leave = True
        else:
            self._terminated = True  # SIGINT, SIGTERM: also ends a retired spoke's wait
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
            if not self.settings.take_over:
                raise StartupError(f"{err.strerror} (--take-over succeeds it)") from None
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
            if self._lock is None:  # --take-over of the spoke serving this cache dir
                if self._handover_off:
                    raise StartupError(f"cannot take over: {self._handover_off}")
                holder = lock.holder(self.layout.spoke_lock)
                adopted = succession.take_over(self, holder)
                assert self._fuse is not None
                self.workers.start(self.mount_workers, self._fuse[0])  # on clones
            else:
                adopted = self._start_or_adopt(reloaded)
            self._listen()
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
            if self._heir is not None:
                self._heir.close(unlink=self._successor is None)
            if self._successor is not None:
                self._retire()
            elif self._reload:
                self._reexec()
            elif self._leave:
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

    def _start_or_adopt(self, reloaded: bool) -> str:
        """Start both children, adopting those a killed supervisor (or this one, before
        its SIGHUP re-exec) left; returns what was adopted, for the operator."""
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
        return adopted

    def _check_encryption(self) -> None:
        """Refuse a cache dir written with another encryption key, or with one when none is
        given (before anything starts; the daemon records a new key itself)."""
        s = self.settings
        try:
            check_cache_key(self.layout, s.block_cipher(), s.encryption_key_file, record=False)
        except EncryptionError as err:
            raise StartupError(str(err)) from None

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

    def _watch(self) -> None:
        while not self._stop:
            time.sleep(0.2)
            if self._stop:
                break
            peer = self._heir.accept() if self._heir is not None else None
            if peer is not None:
                self._successor = succession.hand_over(peer, self)
                if self._successor is not None:
                    count_mount_restart(self.layout, self.layout.successions_file)
                    self._stop = True
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
                # also when a SIGHUP came with the death: the re-executed supervisor must
                # find a first worker to adopt (without one it took the surviving workers'
                # mount for another's and exited: test_mount_workers under load)
                if self._fuse is not None and (not self._stop or self._reload):
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

    def _restart(self, start: object, backoff: Restarts, what: str) -> bool:
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
        self.workers.stop(terminate)
        if self.mount is not None:
            terminate(self.mount)
            self.mount = None
        if self._mounted and is_mounted(self.mountpoint):  # never another spoke's mount
            lazy_unmount(self.mountpoint)
        self._release_connection()  # after the unmount: the connection ends with it
        if self.daemon is not None:
            terminate(self.daemon)
            self.daemon = None
        if self._mounted:  # never a predecessor's, after a take-over that failed
            self.layout.mount_pid_file.unlink(missing_ok=True)  # the mount's, now stopped
        self._release()

    # succession (spoke.run.succession): this spoke as the predecessor, then as the successor

    def _listen(self) -> None:
        try:
            self._heir = succession.Listener(self.layout.succession_socket)
        except OSError as err:
            log.error("succession off: cannot listen on %s (%s)", self.layout.succession_socket,
                      err.strerror)  # fmt: skip

    def succession_terms(self) -> dict[str, Any]:
        """What a successor must match (:func:`spoke.run.succession.terms`)."""
        return succession.terms(
            self.mountpoint, self.settings.allow_other, self.settings.dataset_groups
        )

    def succession_refusal(self) -> str:
        """Why this spoke cannot be taken over now ("" when it can)."""
        if self._fuse is None:
            why = self._handover_off or "its mount did not hand the connection over"
            return f"this spoke does not hold its FUSE connection ({why}): stop it first"
        if self.mount is None or self.daemon is None:
            return "its mount or daemon is restarting: try again"
        return ""

    def lock_descriptor(self) -> int:
        """The descriptor holding ``spoke.lock``."""
        assert self._lock is not None
        return self._lock

    def stop_daemon(self) -> None:
        """Stop the daemon cleanly (the cache and its ports are free; misses wait)."""
        if self.daemon is not None:
            terminate(self.daemon)
            self.daemon = None

    def connection(self) -> tuple[int, bytes]:
        """The held connection: its ``/dev/fuse`` descriptor and INIT request."""
        assert self._fuse is not None
        return self._fuse

    def stop_mount(self) -> None:
        """Every mount process stops reading and exits without unmounting; what they read
        and did not answer is queued again (for the successor's mount processes).

        Raises:
            OSError: the kernel refused ``FUSE_NOTIFY_RESEND``.
        """
        assert self._fuse is not None
        self.workers.stop_reading(HANDOVER_TIMEOUT, self.mount)
        self.mount = None
        handover.notify_resend(self._fuse[0])

    def serve_again(self) -> None:
        """After a successor failed half-way: stop the daemon and mount processes it left
        (``daemon.lock``'s holder; those serving the mountpoint while ours are stopped),
        then start our daemon and resume our mount on the connection still held."""
        strays = [] if self.mount is not None else mount_processes(self.mountpoint)
        daemon = lock.holder(self.layout.daemon_lock)
        for pid in [*strays, *([daemon] if daemon and self.daemon is None else [])]:
            with contextlib.suppress(ProcessLookupError):
                log.warning("succession: stopping pid %d, left by the failed successor", pid)
                terminate(Adopted(pid))
        if self.daemon is None:
            self._restart(self._start_daemon, self._daemon_restarts, "daemon")
        if self.mount is None and self._fuse is not None:
            self._resume_mount()  # the other workers follow from _watch, on their clones
        elif self.mount is not None:  # its successor's first mount process wrote it over
            self.layout.mount_pid_file.write_text(f"{self.mount.pid}\n")

    def take_lock(self, fd: int) -> None:
        """Hold ``spoke.lock`` through the predecessor's descriptor ``fd``.

        Raises:
            StartupError: ``fd`` is not open on this cache dir's ``spoke.lock``.
        """
        held, ours = os.fstat(fd), os.stat(self.layout.spoke_lock)
        if (held.st_dev, held.st_ino) != (ours.st_dev, ours.st_ino):
            os.close(fd)
            raise StartupError("the predecessor sent a descriptor that is not its spoke.lock")
        self._lock = fd
        lock.claim(fd)

    def start_daemon(self) -> None:
        """Start the daemon (:class:`succession.Successor`). Raises StartupError."""
        self._start_daemon()

    def resume(self, fd: int, init: bytes) -> None:
        """Serve the connection of ``fd`` with the INIT request ``init`` beside the
        predecessor's mount processes: our first mount process resumes it on ``fd``, as a
        mount worker joins a connection (the others start once the predecessor's stopped:
        :meth:`run`).

        Raises:
            StartupError: ``fd`` is not ``/dev/fuse``, or the mount process did not resume.
        """
        if not handover.is_fuse_device(fd):
            os.close(fd)
            raise StartupError("the predecessor sent a descriptor that is not /dev/fuse")
        self._fuse = (fd, init)
        self._predecessor_mount = read_pid(self.layout.mount_pid_file)
        self.mount = self._spawn_mount(0, fd)
        self._mount_restarts.up()

    def withdraw(self) -> None:
        """Stop what this successor started, never unmounting, and let go of the lock and
        the connection: the predecessor serves on."""
        self.workers.stop_reading(HANDOVER_TIMEOUT, self.mount)
        self.workers.stop(terminate)
        if self._predecessor_mount:  # our first mount process wrote over its pid
            self.layout.mount_pid_file.write_text(f"{self._predecessor_mount}\n")
        self.mount, self._mounted = None, False
        self._release_connection()
        self.stop_daemon()
        self._release()

    def audit(self, outcome: str, **details: object) -> None:
        """One succession record in the spoke's audit log (:func:`succession.audit`)."""
        succession.audit(self.settings.audit_log or self.layout.root / "audit.jsonl",
                         self.settings, outcome, **details)  # fmt: skip

    def _retire(self) -> None:
        """After a succession: let go of the lock and the connection (the successor holds
        copies), never unmounting; with ``--after-succession wait`` idle until stopped."""
        self.workers.stop(terminate)  # none runs: this closes the clones
        self._release_connection()
        self._release()
        print(
            f"strata-spoke: pid {self._successor} took over {self.mountpoint}; exiting "
            "without unmounting",
            flush=True,
        )
        if self.settings.after_succession != "wait":
            return
        probes = None
        if self.settings.metrics:
            try:
                probes = succession.RetiredProbes(self.settings.metrics)
            except (OSError, ValueError) as err:
                log.warning("no probes while idle: %s: %s", self.settings.metrics, err)
        while not self._terminated:  # SIGTERM, SIGINT (perhaps during the succession)
            time.sleep(0.5)
        if probes is not None:
            probes.close()


def _pid(proc: Process | None) -> str:
    return str(proc.pid) if proc is not None else "-"
