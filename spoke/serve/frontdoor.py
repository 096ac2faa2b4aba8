"""The daemon's socket admits only its own user and root (``SO_PEERCRED``, unix(7)).

gRPC's Python server cannot tell who is on the other end of a UNIX socket, so the daemon
serves gRPC on a private socket (``CACHE_DIR/.grpc/sock``, in a directory only its user
may enter: :func:`spoke.disk.hardening.private_socket_dir`) and puts this front door on
``CACHE_DIR/daemon.sock``, the one the mount dials: each connection's peer credentials are
read from the kernel; a peer with another uid is logged, counted in the audit log and
closed before a byte is read; an admitted one is spliced to the private socket by two
threads (off the daemon's event loop; ``recv``/``sendall`` release the GIL).

Both sockets are 0600 in a 0700 directory (:mod:`spoke.disk.hardening`), so another user cannot
even ``connect(2)``; this check still holds if someone loosens the modes, and it tells root
apart from impostors in logs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
import threading
from pathlib import Path

from spoke.audit import AuditLog

log = logging.getLogger(__name__)

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_CHUNK = 1 << 18


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """``(pid, uid, gid)`` of the process at the other end of a connected UNIX socket."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    return pid, uid, gid


def admitted(uid: int) -> bool:
    """True for the daemon's own uid and root."""
    return uid in (os.geteuid(), 0)


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(_CHUNK):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


class PeerCheckedSocket:
    """Listen on ``front``; forward connections from admitted peers to ``backend``.

    Args:
        front: the public socket path (created 0600; an old file there is replaced).
        backend: the private socket gRPC serves on.
        audit: where refused peers are recorded.
    """

    def __init__(self, front: Path, backend: Path, audit: AuditLog | None = None) -> None:
        self.front, self.backend, self.audit = front, backend, audit
        self.refused = 0
        front.unlink(missing_ok=True)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(front))
        os.chmod(front, 0o600)
        self._listener.listen(64)
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="peercheck", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            pid, uid, _gid = peer_credentials(conn)
            if not admitted(uid):
                self.refused += 1
                log.warning("refused a connection to %s from uid %d (pid %d)", self.front, uid, pid)
                if self.audit is not None:
                    self.audit.record(
                        who=f"uid {uid} pid {pid}", what="connect daemon.sock", outcome="denied"
                    )
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(str(self.backend))
        except OSError as err:
            log.warning("daemon socket backend %s: %s", self.backend, err.strerror)
            conn.close()
            upstream.close()
            return
        back = threading.Thread(target=_pump, args=(upstream, conn), daemon=True)
        back.start()
        _pump(conn, upstream)
        back.join()
        conn.close()
        upstream.close()

    def close(self) -> None:
        """Stop accepting (connections already admitted end with their peers)."""
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._thread.join(5)
        self.front.unlink(missing_ok=True)
