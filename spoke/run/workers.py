"""The mount workers beyond the first: more processes serving the one FUSE connection.

With ``--mount-workers N`` (:func:`spoke.disk.handover.default_workers`) the supervisor,
once it holds the mount's connection, clones its descriptor N-1 times
(:func:`spoke.disk.handover.clone`) and starts a successor mount process on each clone
(fusemount/DESIGN.md, "Mount workers"). It keeps its copy of every clone for the
connection's life: a worker that dies leaves its requests on a device still open, so the
kernel does not fail them (closing the last descriptor of a device ends its unanswered
requests with ECONNABORTED), and ``FUSE_NOTIFY_RESEND`` puts them back in the queue for
the other workers while a new worker is started on the same clone — one worker's death
is handled as a mount death is, without a reader seeing an error.

Everything here runs on the supervisor's one thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field

from spoke.disk import handover
from spoke.run.processes import Adopted, Process

log = logging.getLogger(__name__)

Spawn = Callable[[int, int], Process]
"""``spawn(index, fd)``: start mount worker ``index`` resuming the connection on ``fd``
and return it once it serves. Raises the supervisor's StartupError."""

WORKERS_ENV = "STRATA_SPOKE_HELD_WORKERS"
"""Across the supervisor's SIGHUP re-exec: ``INDEX:FD:PID`` of each worker, comma-separated."""


def stop_reading(proc: Process, timeout: float, what: str) -> None:
    """Ask a mount process to hand its connection over (SIGUSR2: it stops reading and
    exits without unmounting) and wait for it; SIGKILL it after ``timeout`` seconds."""
    proc.send_signal(signal.SIGUSR2)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        log.error("%s did not hand over within %.0f s; killing it", what, timeout)
        proc.kill()
        proc.wait()


@dataclass
class _Worker:
    fd: int  # our copy of its clone (-1: adopted without one, never restarted)
    proc: Process | None
    failures: int = 0
    retry_at: float = 0.0
    up_since: float = field(default_factory=lambda: 0.0)


class MountWorkers:
    """Workers 1..N-1 of the supervisor's mount (worker 0 is the supervisor's ``mount``).

    Args:
        spawn: starts one worker (:data:`Spawn`).
        clock: monotonic seconds (for the restart backoff).
        resumed: called after a worker that died was succeeded on its clone (the
            supervisor counts it in ``strata_spoke_mount_handovers_total``).
    """

    def __init__(
        self, spawn: Spawn, clock: Callable[[], float], resumed: Callable[[], None]
    ) -> None:
        self._spawn = spawn
        self._clock = clock
        self._resumed = resumed
        self._workers: dict[int, _Worker] = {}

    def __len__(self) -> int:
        return len(self._workers)

    def pids(self) -> list[int]:
        """Pids of the workers running now."""
        return [w.proc.pid for w in self._workers.values() if w.proc is not None]

    def start(self, count: int, fuse_fd: int) -> None:
        """Clone ``fuse_fd`` and start workers until ``count`` processes serve in all (this
        one's worker 0 included). A clone or start that fails is logged and retried by
        :meth:`watch` (a refused clone: fewer workers, said once)."""
        for index in range(1, count):
            if index in self._workers:
                continue
            try:
                fd = handover.clone(fuse_fd)
            except OSError as err:
                log.error("mount workers: the kernel refused FUSE_DEV_IOC_CLONE (%s); "
                          "%d worker(s) serve", err, index)  # fmt: skip
                return
            worker = self._workers[index] = _Worker(fd, None)
            self._run(index, worker)

    def _run(self, index: int, worker: _Worker, again: bool = False) -> None:
        try:
            worker.proc = self._spawn(index, worker.fd)
        except Exception as err:  # the supervisor's StartupError: retried with backoff
            worker.failures += 1
            delay = min(0.5 * 2 ** (worker.failures - 1), 30.0)
            worker.retry_at = self._clock() + delay
            log.error("mount worker %d did not start: %s; retrying in %.1f s", index, err, delay)
            return
        worker.up_since = self._clock()
        log.info("mount worker %d (pid %d) serves", index, worker.proc.pid)
        if again:
            self._resumed()

    def watch(self, resend: Callable[[int], None]) -> None:
        """Restart every worker that died (its unanswered requests queued again first, by
        ``resend(fd)`` on its clone) and retry those whose start failed."""
        for index, worker in list(self._workers.items()):
            if worker.proc is not None and worker.proc.poll() is not None:
                status = worker.proc.poll()
                worker.proc = None
                if worker.fd < 0:
                    log.error("adopted mount worker %d exited with status %s", index, status)
                    del self._workers[index]
                    continue
                log.error("mount worker %d exited with status %s; resuming on its device",
                          index, status)  # fmt: skip
                if self._clock() - worker.up_since >= 10.0:
                    worker.failures = 0
                else:  # died soon after its start: back off before the next one
                    worker.failures += 1
                    worker.retry_at = self._clock() + min(0.1 * 2**worker.failures, 30.0)
                resend(worker.fd)
            if worker.proc is None and worker.fd >= 0 and self._clock() >= worker.retry_at:
                self._run(index, worker, again=True)

    def hand_over(self, timeout: float, resend: Callable[[int], None]) -> None:
        """SIGHUP: each worker in turn stops reading (SIGUSR2) and exits, and a new one
        running the code on disk resumes on its clone; the others serve meanwhile. What
        a worker had read and not answered (one killed after ``timeout``) is queued again
        by ``resend(fd)`` first."""
        for index, worker in list(self._workers.items()):
            if worker.proc is not None:
                stop_reading(worker.proc, timeout, f"mount worker {index}")
                worker.proc = None
                if worker.fd >= 0:
                    resend(worker.fd)
            if worker.fd < 0:
                del self._workers[index]
                continue
            worker.failures = 0
            self._run(index, worker, again=True)

    def stop_reading(self, timeout: float, first: Process | None) -> None:
        """Succession (:mod:`spoke.run.succession`): ``first`` (worker 0) and every worker
        stop reading at once (SIGUSR2) and exit without unmounting; one still running
        after ``timeout`` seconds is SIGKILLed (its requests are queued again by the
        caller's ``FUSE_NOTIFY_RESEND``). The clones stay held: should this spoke serve
        on, :meth:`watch` starts a worker on each again."""
        procs = [w.proc for w in self._workers.values() if w.proc is not None]
        procs = [first, *procs] if first is not None else procs
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGUSR2)
        deadline = self._clock() + timeout
        for proc in procs:
            try:
                proc.wait(max(0.0, deadline - self._clock()))
            except subprocess.TimeoutExpired:
                log.error("mount process %d did not stop reading in time; killing it", proc.pid)
                proc.kill()
                proc.wait()
        for index, worker in list(self._workers.items()):
            worker.proc, worker.failures, worker.retry_at = None, 0, 0.0
            if worker.fd < 0:  # adopted without a clone: nothing to start again on
                del self._workers[index]

    def stop(self, terminate: Callable[[Process], None]) -> None:
        """Stop every worker and close the clones (the connection itself lives on while
        the supervisor holds its first descriptor: :meth:`Supervisor.shutdown` unmounts
        after this)."""
        for worker in self._workers.values():
            if worker.proc is not None:
                terminate(worker.proc)
            if worker.fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(worker.fd)
        self._workers.clear()

    def adopt(self, pids: list[int]) -> None:
        """Watch mount workers a killed supervisor left (no clone of ours: not restarted,
        stopped with the mount)."""
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                index = max(self._workers, default=0) + 1
                self._workers[index] = _Worker(-1, Adopted(pid), up_since=self._clock())

    def to_environment(self) -> None:
        """Before the SIGHUP re-exec: the clones cross it (inheritable), and each worker's
        index, clone and pid are written to :data:`WORKERS_ENV`."""
        held = []
        for index, worker in self._workers.items():
            if worker.fd >= 0:
                os.set_inheritable(worker.fd, True)
                pid = worker.proc.pid if worker.proc is not None else 0
                held.append(f"{index}:{worker.fd}:{pid}")
        os.environ[WORKERS_ENV] = ",".join(held)

    def from_environment(self) -> None:
        """After the re-exec: take back the clones and workers held before it."""
        held = os.environ.pop(WORKERS_ENV, "")
        for item in filter(None, held.split(",")):
            index, fd, pid = (int(x) for x in item.split(":"))
            if not handover.is_fuse_device(fd):
                continue
            os.set_inheritable(fd, False)
            proc: Process | None = None
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    proc = Adopted(pid)
            self._workers[index] = _Worker(fd, proc, up_since=self._clock())
