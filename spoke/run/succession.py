"""Spoke succession: a new ``strata-spoke run`` takes over the FUSE connection, the cache
and the mount of the one serving its cache directory, so that a new release or a new pod
(Kubernetes' ``maxSurge``) never ends a reader's open file.

Mount hand-over (:mod:`spoke.disk.handover`) keeps the connection alive while a mount
process is replaced, because the supervisor holds the ``/dev/fuse`` descriptor. Here the
supervisor itself is replaced, so the descriptor moves from one supervisor to the next
over the running one's UNIX socket ``CACHE_DIR/.grpc/heir`` (0600 in a 0700 directory;
:class:`Listener`), one JSON message per ``SOCK_SEQPACKET`` packet, descriptors by
``SCM_RIGHTS``. The old spoke (*predecessor*, :func:`hand_over`) and the new one
(*successor*, :func:`take_over`) go through four steps:

1. The successor says who it is: the protocol it speaks (:data:`PROTOCOL`), the format
   of the inode journal and backing ledger its mount reads
   (:data:`spoke.disk.handover.RESUME_FORMAT`), its mountpoint, ``--allow-other`` (a
   mount option, fixed for the connection's life) and ``--dataset-groups`` (both sides'
   mount processes serve the connection at once: they must show one owner and mode for
   each dataset directory). The predecessor refuses what cannot agree, and refuses
   while it does not hold its connection or a child is restarting; it serves on either
   way.
2. The predecessor stops its daemon (the cache's LMDB and ``daemon.lock`` are free; its
   mount processes go on serving hits, their misses wait for a daemon) and sends a copy
   of its ``spoke.lock`` descriptor: the ``flock`` belongs to the open file, so the lock
   never lapses between the two.
3. The successor starts its daemon (it binds the admin, metrics and peer ports the old
   one released) and asks for the connection: the predecessor sends a copy of its
   ``/dev/fuse`` descriptor and the INIT request, and its mount processes serve on.
4. The successor's mount processes resume the connection beside the predecessor's, as
   mount workers do (``--mount-workers``: the inode journal and backing ledger are
   shared under their locks), and it asks the predecessor to stop: its mount processes
   stop reading (SIGUSR2) and exit without unmounting, and it writes
   ``FUSE_NOTIFY_RESEND``, so what they read and did not answer is served by the
   successor's. The predecessor exits without unmounting (or idles until stopped:
   ``--after-succession wait``, for a pod, whose container exit would restart it).

A reader waits at most for one request the predecessor's mount had read when it was
told to stop (about a mount process's exit), and a miss for the daemons' swap in steps
2-3; never an error. When the successor fails or vanishes half-way, it withdraws what it
started and the predecessor stops whatever it left (``daemon.lock``'s holder, mount
processes of the mountpoint), starts its daemon again and, if its mount processes were
stopped, resumes them on the descriptor it still holds: the mount never stops being
served.
"""

from __future__ import annotations

import contextlib
import http.server
import importlib.metadata
import json
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from spoke.audit import AuditLog
from spoke.disk import handover
from spoke.disk.layout import CacheLayout
from spoke.run.settings import SpokeSettings
from spoke.run.startup import StartupError

log = logging.getLogger(__name__)

PROTOCOL = 1
"""The succession protocol's version: a predecessor takes only a successor speaking it."""
try:
    VERSION = importlib.metadata.version("strata")
    """This release, for the operator's messages."""
except importlib.metadata.PackageNotFoundError:  # run from a source tree never installed
    VERSION = "unknown"

ANSWER_TIMEOUT = 30.0  # seconds for the other side's next message (a daemon stop or start)
RESUME_TIMEOUT = 60.0  # seconds for the successor's mount to resume the connection
CONNECT_WAIT = 30.0  # seconds a successor waits for a starting predecessor's socket
_MAX_MESSAGE = 65536
_PEERCRED = struct.Struct("3i")


class Predecessor(Protocol):
    """What :func:`hand_over` needs of the running supervisor."""

    layout: CacheLayout
    mountpoint: Path

    def succession_terms(self) -> dict[str, Any]:
        """What a successor must match (:func:`terms`)."""

    def succession_refusal(self) -> str:
        """Why this spoke cannot be taken over now ("" when it can)."""

    def lock_descriptor(self) -> int:
        """The descriptor holding ``spoke.lock``."""

    def stop_daemon(self) -> None:
        """Stop the daemon (the cache is free; the mount's misses wait)."""

    def connection(self) -> tuple[int, bytes]:
        """The held connection: its ``/dev/fuse`` descriptor and INIT request."""

    def stop_mount(self) -> None:
        """Stop every mount process reading and queue again what they read. Raises
        OSError when the kernel refused the resend."""

    def serve_again(self) -> None:
        """Stop what a failed successor left and serve as before."""

    def audit(self, outcome: str, **details: object) -> None:
        """One succession record in the spoke's audit log."""


class Successor(Protocol):
    """What :func:`take_over` needs of the starting supervisor."""

    layout: CacheLayout
    mountpoint: Path

    def succession_terms(self) -> dict[str, Any]:
        """What this spoke would run with (:func:`terms`)."""

    def take_lock(self, fd: int) -> None:
        """Hold ``spoke.lock`` through ``fd``. Raises StartupError for another file."""

    def start_daemon(self) -> None:
        """Start the daemon. Raises StartupError."""

    def resume(self, fd: int, init: bytes) -> None:
        """Start mount processes resuming the connection of ``fd`` (the predecessor's
        serve on). Raises StartupError."""

    def withdraw(self) -> None:
        """Stop what it started (never unmounting) and let go of the lock and descriptor."""

    def audit(self, outcome: str, **details: object) -> None:
        """One succession record in the spoke's audit log."""


def terms(
    mountpoint: Path, allow_other: bool, dataset_groups: Sequence[str] = ()
) -> dict[str, Any]:
    """The terms both sides compare: protocol, resume format, mountpoint, mount options
    and the dataset directories' groups (resolved: ``GLOB=GID``)."""
    return {
        "protocol": PROTOCOL,
        "resume_format": handover.RESUME_FORMAT,
        "mount": str(mountpoint),
        "allow_other": allow_other,
        "dataset_groups": list(dataset_groups),
    }


def refusal(theirs: dict[str, Any], mine: dict[str, Any]) -> str:
    """Why a successor with ``theirs`` terms cannot take over one with ``mine`` ("" when it
    can); the message says what to do."""
    if theirs.get("protocol") != mine["protocol"]:
        return (
            f"succession protocol {theirs.get('protocol')!r}, this spoke speaks "
            f"{mine['protocol']}: stop this spoke (its readers' open files end) and start "
            "the new one"
        )
    if theirs.get("resume_format") != mine["resume_format"]:
        return (
            f"its mount reads inode journal/backing ledger format "
            f"{theirs.get('resume_format')!r}, this connection's is {mine['resume_format']}: "
            "stop this spoke (its readers' open files end) and start the new one"
        )
    if theirs.get("mount") != mine["mount"]:
        return f"it would mount {theirs.get('mount')}, this spoke serves {mine['mount']}"
    if theirs.get("allow_other") != mine["allow_other"]:
        return (
            "--allow-other differs, and mount options are fixed for the FUSE connection's "
            "life: start the new spoke with this one's --allow-other"
        )
    theirs_groups = ",".join(theirs.get("dataset_groups") or []) or "none"
    mine_groups = ",".join(mine.get("dataset_groups") or []) or "none"
    if theirs_groups != mine_groups:
        return (
            f"--dataset-groups differs (its {theirs_groups}, this spoke's {mine_groups}, "
            "groups as gids): start the new spoke with this one's --dataset-groups, or "
            "stop this spoke and start the new one"
        )
    return ""


class Listener:
    """The predecessor's side: a non-blocking UNIX socket at ``path`` (0600).

    Raises:
        OSError: the socket cannot be made (the caller serves on without succession).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        path.unlink(missing_ok=True)  # a dead predecessor's: we hold the lock
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            self._sock.bind(str(path))
            os.chmod(path, 0o600)
            self._sock.listen(2)
        except OSError:
            self._sock.close()
            raise
        self._sock.setblocking(False)
        self._inode = os.stat(path).st_ino

    def accept(self) -> socket.socket | None:
        """A successor that connected (root, or this process's user), else None."""
        try:
            peer, _ = self._sock.accept()
        except OSError:  # nobody (EAGAIN), or a connection that went away
            return None
        peer.setblocking(True)
        _, uid, _ = _PEERCRED.unpack(
            peer.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
        )
        if uid not in (0, os.getuid()):
            log.warning("succession: refused a connection from uid %d", uid)
            peer.close()
            return None
        return peer

    def close(self, unlink: bool = True) -> None:
        """Stop listening; ``unlink`` the socket file when it is still ours (never after a
        succession: the successor's may be there)."""
        self._sock.close()
        with contextlib.suppress(OSError):
            if unlink and os.stat(self.path).st_ino == self._inode:
                self.path.unlink()


def hand_over(peer: socket.socket, spoke: Predecessor) -> int | None:
    """The predecessor's side of one succession, on the connection ``peer`` (closed here).

    Returns:
        The successor's pid once it serves the connection (this spoke must then exit
        without unmounting); None when the succession was refused or failed (this spoke
        serves on: what it stopped was started again).
    """
    with peer:
        try:
            request, fds = _receive(peer, ANSWER_TIMEOUT)
        except OSError as err:
            log.warning("succession: no request from the new spoke (%s)", err)
            return None
        _close(fds)
        who = f"pid {request.get('pid')} (strata {request.get('version')})"
        reason = refusal(request, spoke.succession_terms()) or spoke.succession_refusal()
        if reason:
            log.warning("succession: refused the take-over by %s: %s", who, reason)
            spoke.audit(f"refused: {reason}", successor=who)
            with contextlib.suppress(OSError):
                _send(peer, {"ok": False, "reason": reason, "version": VERSION})
            return None
        log.warning("succession: %s takes over %s; stopping the daemon", who, spoke.mountpoint)
        started = time.monotonic()
        spoke.stop_daemon()
        try:
            hello = {"ok": True, "version": VERSION, "pid": os.getpid()}
            _send(peer, hello, [spoke.lock_descriptor()])
            log.info("succession: daemon stopped in %.2f s", time.monotonic() - started)
            _expect(_receive(peer, ANSWER_TIMEOUT + 10), "connection")
            fd, init = spoke.connection()
            _send(peer, {"ok": True, "init": init.hex()}, [fd])
            _expect(_receive(peer, RESUME_TIMEOUT), "stop")
            asked = time.monotonic()
            spoke.stop_mount()
            log.info("succession: mount stopped in %.2f s", time.monotonic() - asked)
            _send(peer, {"ok": True})
            _expect(_receive(peer, ANSWER_TIMEOUT), "serving")
        except (OSError, _Withdrawn) as err:
            log.error("succession: the take-over by %s failed (%s); serving on", who, err)
            spoke.audit(f"failed: {err}; serving on", successor=who)
            spoke.serve_again()
            return None
        took = time.monotonic() - started
        log.warning("succession: %s serves %s (%.2f s after the request); exiting without "
                    "unmounting", who, spoke.mountpoint, took)  # fmt: skip
        spoke.audit("handed over", successor=who, seconds=round(took, 3))
        return int(request.get("pid") or 0)


def take_over(spoke: Successor, holder: int | None) -> str:
    """The successor's side: take over the spoke serving ``spoke``'s cache dir (pid
    ``holder``, for messages).

    Returns:
        What was done, for the operator.

    Raises:
        StartupError: no predecessor answered, it refused (its reason), or the take-over
            failed half-way (then everything started here is stopped again and the
            predecessor serves on).
    """
    by = f"the spoke serving {spoke.layout.root} (pid {holder or '?'})"
    peer = _connect(spoke.layout.succession_socket, by)
    with peer:
        try:
            _send(peer, {"op": "succeed", "pid": os.getpid(), "version": VERSION,
                         **spoke.succession_terms()})  # fmt: skip
            reply, fds = _receive(peer, ANSWER_TIMEOUT + 10)
        except OSError as err:
            raise StartupError(f"{by} did not answer the take-over: {err}") from None
        old = f"pid {reply.get('pid', holder)}, strata {reply.get('version')}"
        if not reply.get("ok") or len(fds) != 1:
            _close(fds)
            raise StartupError(f"{by} refused the take-over: {reply.get('reason', reply)}")
        spoke.take_lock(fds[0])
        started = time.monotonic()
        try:
            spoke.start_daemon()
            log.info("succession: daemon started in %.2f s", time.monotonic() - started)
            _send(peer, {"op": "connection"})
            reply, fds = _receive(peer, ANSWER_TIMEOUT)
            if not reply.get("ok") or len(fds) != 1:
                _close(fds)
                raise StartupError(f"no FUSE connection came: {reply}")
            spoke.resume(fds[0], bytes.fromhex(str(reply.get("init", ""))))
            _send(peer, {"op": "stop"})
            reply, fds = _receive(peer, ANSWER_TIMEOUT)
            _close(fds)
            if not reply.get("ok"):
                raise StartupError(f"the mount there did not stop: {reply}")
            _send(peer, {"op": "serving"})
        except (OSError, StartupError, ValueError) as err:
            spoke.withdraw()
            with contextlib.suppress(OSError):
                _send(peer, {"op": "abort", "reason": str(err)})
            raise StartupError(f"the take-over from {old} failed ({err}); it serves on") from None
    took = time.monotonic() - started
    spoke.audit("took over", predecessor=old, seconds=round(took, 3))
    return f"took over {spoke.mountpoint} from {old} in {took:.2f} s, without unmounting"


def audit(path: Path, settings: SpokeSettings, outcome: str, **details: object) -> None:
    """Append one record (``what``: ``succession``, ``who``: this supervisor) to the audit
    log ``path`` with ``settings``' rotation, beside the daemon's records (whole lines in
    append mode: the two writers never tear each other's). A log that cannot be written
    is logged, never raised."""
    try:
        trail = AuditLog(path, max_bytes=int(settings.audit_max_bytes),
                         backups=settings.audit_backups)  # fmt: skip
        try:
            trail.record(who=f"strata-spoke run pid {os.getpid()} (strata {VERSION})",
                         what="succession", outcome=outcome, **details)  # fmt: skip
        finally:
            trail.close()
    except (OSError, ValueError) as err:
        log.error("succession not audited (%s): %s", err, outcome)


class RetiredProbes:
    """The probes of a spoke that was taken over and idles (``--after-succession wait``),
    on the ``--metrics`` address its daemon left: ``/healthz`` 200, so the kubelet never
    restarts the container (a restarted spoke with ``--take-over`` would take the
    connection back), ``/readyz`` 503 (it serves nothing), anything else 404.

    Args:
        address: ``HOST:PORT``.

    Raises:
        ValueError: not HOST:PORT.
        OSError: the address is taken (by the successor's daemon, on the host network).
    """

    def __init__(self, address: str) -> None:
        from spoke.serve.adminserver import bind  # only a retired spoke needs it

        sock = bind(address)

        class Probes(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.partition("?")[0]
                code = {"/healthz": 200, "/readyz": 503}.get(path, 404)
                body = b"taken over by a new spoke\n"
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = http.server.ThreadingHTTPServer(
            sock.getsockname()[:2], Probes, bind_and_activate=False
        )
        self._server.socket.close()
        self._server.socket = sock
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()


class _Withdrawn(Exception):
    """The successor gave up (its reason), or said something out of turn."""


def _expect(got: tuple[dict[str, Any], list[int]], op: str) -> None:
    message, fds = got
    _close(fds)
    if message.get("op") != op:
        raise _Withdrawn(str(message.get("reason") or f"{message.get('op')!r}, not {op!r}"))


def _connect(path: Path, by: str) -> socket.socket:
    """Connect to the predecessor's socket, waiting up to :data:`CONNECT_WAIT` seconds
    for one that is still starting."""
    deadline = time.monotonic() + CONNECT_WAIT
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            sock.connect(str(path))
            return sock
        except OSError as err:
            sock.close()
            if time.monotonic() >= deadline:
                raise StartupError(
                    f"{by} does not offer succession ({err.strerror}: it predates it, or is "
                    "still starting): stop it first, or try again"
                ) from None
        time.sleep(0.2)


def _send(sock: socket.socket, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
    socket.send_fds(sock, [json.dumps(message).encode()], list(fds))


def _receive(sock: socket.socket, timeout: float) -> tuple[dict[str, Any], list[int]]:
    """One message and the descriptors that came with it.

    Raises:
        OSError: timed out, the other side closed or sent something that is not a message.
    """
    sock.settimeout(timeout)
    data, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 4)
    for fd in fds:  # SCM_RIGHTS gives them without close-on-exec
        os.set_inheritable(fd, False)
    if not data:
        _close(fds)
        raise ConnectionError("the other spoke closed the connection")
    try:
        message = json.loads(data)
    except ValueError:
        message = None
    if not isinstance(message, dict):
        _close(fds)
        raise ConnectionError(f"not a succession message: {data[:80]!r}")
    return message, fds


def _close(fds: Sequence[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
