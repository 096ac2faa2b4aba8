"""Helpers for the stalled-reader tests of the admin API's server: one served in this process
with test-sized bounds, clients that pipeline requests and never read (or read a little now
and then), the closed-connection counter."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import select
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import REGISTRY

from spoke.serve.adminserver import AdminServer, admin_config, bind
from tests.support import eventually

RCVBUF = 4096  # the probe's receive buffer: the kernel takes little of what the server sends
BIG = 4 << 20  # bytes of /big: a large pin list
PAGE = 25_700  # bytes of /page: the probe's /metrics answer
CLOSED = "strata_spoke_admin_connections_closed_total"


def closed(reason: str) -> float:
    """This process's admin connections closed for ``reason`` so far."""
    return REGISTRY.get_sample_value(CLOSED, {"reason": reason}) or 0.0


ANSWERED: collections.Counter[str] = collections.Counter()  # requests :func:`app` took, by path


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """``/healthz`` (``ok``), ``/big`` (:data:`BIG` bytes, in one piece), ``/page``
    (:data:`PAGE` bytes) and ``/slow`` (``ok`` after 3 s); counts each in :data:`ANSWERED`."""
    if scope["type"] != "http":
        return
    ANSWERED[scope["path"]] += 1
    if scope["path"] == "/slow":
        await asyncio.sleep(3)
    body = b"x" * {"/big": BIG, "/page": PAGE}.get(scope["path"], 0) or b"ok"
    headers = [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@contextlib.contextmanager
def serving(**bounds: Any) -> Iterator[tuple[str, int]]:
    """:func:`app` served by the admin API's server on 127.0.0.1 in a thread of this
    process, with ``bounds`` for :func:`admin_config`; yields its address."""
    sock = bind("127.0.0.1:0")
    server = AdminServer(admin_config(app, **bounds))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])))
    thread.start()
    try:
        eventually(lambda: server.started, "the admin server started", 10)
        host, port = sock.getsockname()[:2]
        yield host, port
    finally:
        server.should_exit = server.force_exit = True  # stalled ones would hold a shutdown
        thread.join(30)
        sock.close()


class Stalled:
    """``n`` connections to ``host:port``, each with a 4 KiB receive buffer, sending up to
    ``requests`` pipelined ``GET path`` and reading nothing."""

    def __init__(
        self, host: str, port: int, n: int, path: str = "/healthz", requests: int = 30_000
    ) -> None:
        self.socks: list[socket.socket] = []
        request = f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
        self._payload = memoryview(request * requests)  # one copy, shared
        self._sent: list[int] = []  # bytes of it each has sent
        for _ in range(n):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
            sock.settimeout(10)
            sock.connect((host, port))
            sock.setblocking(False)
            self.socks.append(sock)
            self._sent.append(0)

    def pump(self, quiet_s: float = 1.0, timeout: float = 30.0) -> None:
        """Send what the server takes until it has taken nothing for ``quiet_s`` seconds
        (it stopped reading: it is stalled on the responses), or ``timeout`` passed."""
        end = time.monotonic() + timeout
        quiet_since = time.monotonic()
        while time.monotonic() < end and time.monotonic() - quiet_since < quiet_s:
            for i, sock in enumerate(self.socks):
                if self._sent[i] >= len(self._payload):
                    continue
                try:
                    self._sent[i] += sock.send(self._payload[self._sent[i] :])
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:  # closed by the server already
                    self._sent[i] = len(self._payload)
                    continue
                quiet_since = time.monotonic()
            time.sleep(0.05)

    def open(self) -> int:
        """How many the server has not ended or reset yet (asks the kernel; reads nothing)."""
        poll = select.poll()
        for sock in self.socks:
            poll.register(sock, select.POLLRDHUP)
        ended = select.POLLRDHUP | select.POLLHUP | select.POLLERR
        return len(self.socks) - sum(1 for _, ev in poll.poll(0) if ev & ended)

    def close(self) -> None:
        """Close every one of them."""
        for sock in self.socks:
            sock.close()


def get(host: str, port: int, path: str, timeout: float = 5.0) -> bytes:
    """One ``GET path`` on a connection of its own; the raw response (headers and body)."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        parts = []
        while part := sock.recv(65536):
            parts.append(part)
        return b"".join(parts)


class SlowReaders:
    """The probe's slow readers, in a thread: ``n`` connections to ``host:port`` kept open
    (one opened again for each the server ends), each with a 2 KiB receive buffer, sending
    ``requests`` pipelined ``GET path`` at once and then reading ``chunk`` bytes from each
    every ``period`` seconds, so that each acknowledges a little all the time.

    A connection counts as accepted once a byte of an answer arrived on it (looked at as it
    opens: the server answers at once; one refused at the cap is reset with none).
    """

    def __init__(
        self,
        host: str,
        port: int,
        n: int,
        path: str = "/page",
        chunk: int = 2048,
        period: float = 0.6,
        requests: int = 200,
    ) -> None:
        self._addr, self._n, self._chunk, self._period = (host, port), n, chunk, period
        self._request = f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode() * requests
        self.socks: list[socket.socket] = []  # accepted and not yet seen ended
        self.accepted = 0  # connections the server answered
        self.refused = 0  # connections reset before any answer (at the cap)
        self.ended = 0  # accepted connections the server ended since
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def __enter__(self) -> SlowReaders:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        for sock in self.socks:
            sock.close()

    def _open(self) -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
        sock.settimeout(5)
        try:
            sock.connect(self._addr)
            sock.sendall(self._request)
            answered = bool(sock.recv(1, socket.MSG_PEEK))
        except OSError:
            answered = False
        if not answered:
            sock.close()
            self.refused += 1
            return
        sock.setblocking(False)
        self.socks.append(sock)
        self.accepted += 1

    def _read(self) -> None:
        for sock in list(self.socks):
            try:
                ended = not sock.recv(self._chunk)
            except (BlockingIOError, InterruptedError):
                ended = False
            except OSError:
                ended = True
            if ended:
                self._end(sock)

    def _end(self, sock: socket.socket) -> None:
        self.socks.remove(sock)
        sock.close()
        self.ended += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            start = time.monotonic()
            while len(self.socks) < self._n and not self._stop.is_set():
                self._open()
            self._read()
            self._stop.wait(max(0.0, self._period - (time.monotonic() - start)))

    def stop(self) -> None:
        """Stop opening and reading; then count those the server has ended meanwhile (asks
        the kernel; reads nothing)."""
        self._stop.set()
        self._thread.join(30)
        poll = select.poll()
        for sock in self.socks:
            poll.register(sock, select.POLLRDHUP)
        gone = select.POLLRDHUP | select.POLLHUP | select.POLLERR
        by_fd = {sock.fileno(): sock for sock in self.socks}
        for fd, ev in poll.poll(0):
            if ev & gone:
                self._end(by_fd[fd])
