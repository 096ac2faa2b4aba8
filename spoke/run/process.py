"""Stopping a child process: SIGTERM, a grace period, then SIGKILL.

The supervisor stops its daemon and mount this way, and so do the local process
harness (:mod:`deploy.local`), the benchmarks and the tests: one home, so a child
that ignores SIGTERM is killed the same way everywhere. It lives in the spoke because
the supervisor needs it and the spoke may not import :mod:`deploy` (which imports it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

from spoke.run.processes import Process


def stop_process(proc: Process, timeout: float = 20.0, *, group: bool = True) -> None:
    """Stop ``proc``: SIGTERM, wait up to ``timeout`` s, then SIGKILL; no-op once it exited.

    Args:
        proc: The child (a :class:`subprocess.Popen`, or a process the supervisor adopted).
        timeout: Seconds to wait after SIGTERM, and again after SIGKILL (default 20 s:
            a hub or spoke of the local harness flushing its state).
        group: SIGKILL the child's whole process group (``killpg``; the child must lead
            one, e.g. started with ``start_new_session=True``), else the child alone.

    Never raises for a child that is already gone; a child still alive after the second
    wait is left to the caller (``proc.poll()`` is None).
    """
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):  # gone in between
            if group:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout)
