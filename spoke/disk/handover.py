"""Mount hand-over: a successor process resumes the FUSE connection of the one before.

The kernel ends a FUSE connection when the last descriptor of its ``/dev/fuse`` file is
closed, and libfuse answers every request of a session that has not seen ``FUSE_INIT``
with EIO. So a mount process that dies takes its mount with it (readers get ENOTCONN) —
unless someone else holds the descriptor and the successor's session starts as already
initialised. The pieces (the pyfuse3 calls from ``native/pyfuse3-passthrough.patch``):

1. After INIT the mount process sends the supervisor a copy of its ``/dev/fuse``
   descriptor and the INIT request it read (``pyfuse3.session_descriptor``,
   ``init_request``) over a UNIX socket (``SCM_RIGHTS``): :func:`publish`. The supervisor
   holds the descriptor for the connection's life.
2. When the mount process dies (or hands over on SIGUSR2: it stops reading and exits
   without unmounting), the supervisor writes ``FUSE_NOTIFY_RESEND`` (Linux >= 6.9) on the
   descriptor, which puts every request the dead process had read but not answered back
   in the queue (:func:`notify_resend`), and starts a successor with the descriptor.
3. The successor opens a libfuse session on ``/dev/fd/N`` (libfuse then neither mounts
   nor unmounts), replays the INIT request (``pyfuse3.resume``: its reply goes to a
   request id the kernel never issued and is dropped), takes over the inode numbers
   (:mod:`fusemount.journal`) and backing ids (:mod:`fusemount.ledger`) of the connection,
   tells the supervisor it serves (:func:`announce_resumed`) and serves.

The same pieces let several *mount workers* serve one connection at once
(``--mount-workers N``): the supervisor clones the held descriptor N-1 times
(``FUSE_DEV_IOC_CLONE``, :func:`clone`: each clone is a device of the same connection, and
the kernel hands each request to whichever device is read first and takes its reply only on
that device) and starts a successor on each clone, which resumes the connection as above;
each is a process of its own, with its own GIL. A worker that dies is one more mount death:
its clone is held by the supervisor, so what it had read is queued again
(``FUSE_NOTIFY_RESEND`` covers every device of the connection) and a new worker resumes on
that clone.

Readers holding open files see a delay while no process serves, never an error. Where
this cannot work — ``--mount-handover off``, a pyfuse3 without ``resume``, a kernel that
refuses the resend — the supervisor says so and remounts as before.

This module is the contract both sides keep (the variables, the control socket's
messages, the ioctls), so it lives in :mod:`spoke.disk`, the room the supervisor
(:mod:`spoke.run`) and the mount (:mod:`fusemount`) may both import: the daemon side never
imports the mount.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct

import pyfuse3

NOTIFY_RESEND = 7
"""``FUSE_NOTIFY_RESEND`` of ``enum fuse_notify_code`` (include/uapi/linux/fuse.h, 7.40)."""

HANDOVER_ENV = "STRATA_MOUNT_HANDOVER_FD"
"""The mount process's end of the supervisor's hand-over socket (a descriptor number)."""
RESUME_ENV = "STRATA_MOUNT_RESUME_FD"
"""In a successor: the ``/dev/fuse`` descriptor of the connection to resume."""
INIT_ENV = "STRATA_MOUNT_RESUME_INIT"
"""In a successor: the connection's FUSE_INIT request, hex."""

WORKER_ENV = "STRATA_MOUNT_WORKER"
"""In a mount worker: its index (0 is the process that mounted, or its successor)."""
WORKERS_ENV = "STRATA_MOUNT_WORKERS"
"""In every mount process: how many workers serve the connection."""

FUSE_DEV_IOC_CLONE = 0x8004E500
"""``_IOR(229, 0, uint32_t)`` (include/uapi/linux/fuse.h): make an opened ``/dev/fuse``
file another device of the connection whose descriptor is passed."""

MAX_DEFAULT_WORKERS = 8

RESUME_FORMAT = 1
"""The version of what a successor's mount reads to resume a connection another release
may have served (the INIT request as pyfuse3 keeps it, the inode journal's records, the
backing ledger's slots): bump it when any of them changes, so that a spoke of one release
refuses to hand its connection to a spoke of another that would misread them
(:mod:`spoke.run.succession`)."""

_SESSION = b"session "
_RESUMED = b"resumed"
_OFF = b"off "

REASON_MOST = 2048
"""Most bytes of a reason a mount sends with :func:`decline`."""


def library_supports() -> bool:
    """True when pyfuse3 has the hand-over calls (the patched build)."""
    return all(hasattr(pyfuse3, n) for n in ("resume", "init_request", "session_descriptor"))


def unavailable_reason(mode: str) -> str:
    """Why this mount cannot be handed over ("" when it may be)."""
    if mode == "off":
        return "--mount-handover off"
    if not library_supports():
        return "pyfuse3 was built without resume (make setup builds it)"
    return ""


def notify_resend(fuse_fd: int) -> None:
    """Ask the kernel to queue again every request of the connection that was read but
    not answered (``FUSE_NOTIFY_RESEND``: a notification is a reply with unique 0 and the
    code in the error field).

    Raises:
        OSError: the kernel refused it (EINVAL before Linux 6.9) or the connection is gone.
    """
    os.write(fuse_fd, struct.pack("<IiQ", 16, NOTIFY_RESEND, 0))


def publish(control: socket.socket, fuse_fd: int, init_request: bytes) -> None:
    """Send the supervisor a copy of the session's descriptor and its INIT request."""
    socket.send_fds(control, [_SESSION + init_request], [fuse_fd])


def announce_resumed(control: socket.socket) -> None:
    """Tell the supervisor this successor serves the connection now."""
    control.sendall(_RESUMED)


def decline(control: socket.socket, reason: str) -> None:
    """Tell the supervisor this new mount will not hand its connection over, and why (at
    most :data:`REASON_MOST` bytes of it): it stops waiting for the connection at once.
    Else a mount whose records could not be kept (a full cache disk) left its supervisor
    waiting :data:`~spoke.run.children.HANDOVER_TIMEOUT` (10 s) for a connection that
    never came, before the spoke was ready.

    Raises:
        OSError: the supervisor is gone.
    """
    control.sendall(_OFF + reason.encode("utf-8", "replace")[:REASON_MOST])


def receive(control: socket.socket, timeout: float) -> tuple[int, bytes] | bool | str:
    """Wait up to ``timeout`` seconds for the mount's message.

    Returns:
        ``(descriptor, init_request)`` from a new mount; the reason (a str) from a new
        mount that will not hand its connection over (:func:`decline`); True from a
        successor that resumed; False when nothing (or nothing valid) came.
    """
    control.settimeout(timeout)
    try:
        data, fds, _, _ = socket.recv_fds(control, 4096, 1)
    except OSError:  # timed out, or the process died
        return False
    if data.startswith(_SESSION) and len(fds) == 1:
        return fds[0], data[len(_SESSION) :]
    for fd in fds:
        os.close(fd)
    if data.startswith(_OFF) and not fds:
        return data[len(_OFF) :].decode("utf-8", "replace")
    return data == _RESUMED


def is_fuse_device(fd: int) -> bool:
    """True when ``fd`` is open on ``/dev/fuse`` (checked before a held number is trusted
    across a re-exec)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == "/dev/fuse"
    except OSError:
        return False


def default_workers(setting: int, cores: int | None = None) -> int:
    """Mount workers for ``--mount-workers`` (``setting``; 0: one per 4 cores, 1 to
    :data:`MAX_DEFAULT_WORKERS`: the daemon, the readers and the kernel's own work need
    the other cores; on 2 cores a second worker only takes CPU from them)."""
    if setting > 0:
        return setting
    cores = cores or len(os.sched_getaffinity(0))
    return max(1, min(MAX_DEFAULT_WORKERS, cores // 4))


def clone(fuse_fd: int) -> int:
    """A new descriptor that is another device of ``fuse_fd``'s connection (close-on-exec).

    Raises:
        OSError: ``/dev/fuse`` cannot be opened, or the kernel refused the clone.
    """
    fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, FUSE_DEV_IOC_CLONE, struct.pack("<I", fuse_fd))
    except OSError:
        os.close(fd)
        raise
    return fd
