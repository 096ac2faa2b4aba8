"""The HTTP endpoint serving the hub's metrics (``/metrics``) and readiness (``/readyz``).

A thread-per-connection ``wsgiref`` server (prometheus_client's), one request per
connection (HTTP/1.0, no keep-alive: a connection is closed after its answer), bounded so
that a client that sends its request slowly, or never reads its answer, cannot keep
Prometheus and the kubelet's probes out:

- at most :data:`METRICS_MAX_CONNECTIONS` connections (threads) open at once. A connection
  arriving at the cap first displaces one of an address holding two more connections than
  its own (one, if its own holds none; fair shares by address,
  :mod:`strata_local.slotshare`: one address's flood never keeps the kubelet out), else the
  open one that has waited longest for its request, if that is at least
  :data:`DISPLACE_AFTER_S`; a connection whose request has been read and is being answered
  is never displaced. With none such the newcomer is closed as it arrives, nothing read;
- a request deadline, :data:`METRICS_REQUEST_DEADLINE_S`: the request line and headers
  (these endpoints take no body) must all have arrived that long after the connection was
  accepted, however slowly they trickle in (each ``recv`` waits only for what is left of
  it), else the connection is closed (slowloris: a byte every few seconds used to keep a
  slot for good);
- a send deadline, :data:`METRICS_SEND_TIMEOUT_S`: the whole answer must have been taken by
  the kernel that long after its first byte was sent, else the connection is aborted
  (reset, its unsent bytes freed).

Each is counted in ``strata_hub_metrics_connections_closed_total{reason}``: ``limit``,
``displaced``, ``timeout``, ``stalled``.
"""

from __future__ import annotations

import collections
import contextlib
import io
import logging
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import Counter, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from hub.errors import ListenError
from hub.serve.address import Address
from hub.serve.metrics import HubMetrics
from strata_local.slotshare import victim

logger = logging.getLogger(__name__)

METRICS_MAX_CONNECTIONS = 32
"""Most connections open to the metrics endpoint at once (one thread each); beyond it a
newcomer displaces the one waiting longest for its request (:data:`DISPLACE_AFTER_S`) or is
closed as it arrives. Prometheus holds one per scrape, the kubelet one per probe."""

METRICS_REQUEST_DEADLINE_S = 5.0
"""Longest a connection may take to send its whole request (request line and headers) from
when it was accepted, seconds; then it is closed (a scrape or probe sends it at once; the
kubelet waits 1 s and Prometheus 10 s for the answer)."""

METRICS_SEND_TIMEOUT_S = 10.0
"""Longest the whole answer may take to be sent from its first byte, seconds (a client that
reads none of a large ``/metrics`` holds its thread until then); then the connection is
aborted."""

DISPLACE_AFTER_S = 0.05
"""Least time a connection must have waited for its request, seconds, before one arriving at
the cap may displace it (an honest client sends its request within milliseconds). Short,
because the one waiting longest goes first: a client opening silent connections faster
than the cap over this (640 a second) is needed to keep a scrape or probe out, where 1 s let
100 a second fail every probe (the twelfth probe). That holds among addresses within one
connection of each other; an address holding more gives up its connections at any age
(:mod:`strata_local.slotshare`), so one address cannot keep another out at any rate (the
thirteenth probe's 1,200 a second did)."""


_LEAVE_WAIT_S = 1.0
"""Longest the accepting thread waits for a displaced connection's thread to end (it ends
at once: its socket is shut down), seconds; then the newcomer is refused."""


class _Displaced(ConnectionAbortedError):
    """The connection was closed by the server to make room for a newcomer."""


class _SendStalled(ConnectionAbortedError):
    """The client did not take the answer within :data:`METRICS_SEND_TIMEOUT_S`."""


@dataclass
class _Connection:
    """One open connection, as the server's table knows it (changed under its lock).

    Attributes:
        sock: The connection's socket.
        accepted: When it was accepted, ``time.monotonic()`` seconds.
        client: The client's address (its host), for fair shares at the cap.
        answering: Its request has been read and is being answered (never displaced).
        dropped: It was displaced (its socket shut down by the accepting thread).
    """

    sock: socket.socket
    accepted: float
    client: str = ""
    answering: bool = False
    dropped: bool = False


class _DeadlineReader(io.RawIOBase):
    """Reads a socket until a deadline: each ``recv`` waits only for what is left of it.

    Raises :class:`TimeoutError` past the deadline, :class:`_Displaced` once the connection
    was displaced (its socket shut down: a read returns no bytes).
    """

    def __init__(self, conn: _Connection, deadline: float) -> None:
        super().__init__()
        self._conn = conn
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._conn.dropped:  # (a bool, set under the server's lock; read without it)
            raise _Displaced
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("request deadline passed")
        self._conn.sock.settimeout(left)
        read = self._conn.sock.recv_into(buffer)
        if read == 0 and self._conn.dropped:
            raise _Displaced
        return read


class _DeadlineWriter(io.BufferedIOBase):
    """Sends to a socket (unbuffered, whole writes) within ``send_timeout_s`` from the first
    byte; past it raises :class:`_SendStalled` (``wsgiref`` drops the connection quietly on
    a ``ConnectionAbortedError``) and sets :attr:`stalled`."""

    def __init__(self, sock: socket.socket, send_timeout_s: float) -> None:
        super().__init__()
        self._sock = sock
        self._send_timeout_s = send_timeout_s
        self._deadline: float | None = None
        self.stalled = False

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        now = time.monotonic()
        if self._deadline is None:
            self._deadline = now + self._send_timeout_s
        try:
            if self._deadline <= now:
                raise TimeoutError
            self._sock.settimeout(self._deadline - now)
            self._sock.sendall(data)
        except TimeoutError:
            self.stalled = True
            raise _SendStalled from None
        return memoryview(data).nbytes


class _QuietHandler(WSGIRequestHandler):
    """One request per connection, logged nowhere, read within the server's request deadline
    and answered within its send timeout (:class:`_BoundedServer`)."""

    server: _BoundedServer
    rfile: io.BufferedReader
    wfile: _DeadlineWriter  # type: ignore[assignment]

    def setup(self) -> None:
        """Files over the socket that keep to the connection's deadlines (instead of
        ``StreamRequestHandler``'s, whose socket timeout bounds each ``recv`` alone)."""
        self.connection = self.request
        self._conn = self.server.opened(self.request)
        deadline = self._conn.accepted + self.server.request_deadline_s
        self.rfile = io.BufferedReader(_DeadlineReader(self._conn, deadline))
        self.wfile = _DeadlineWriter(self.request, self.server.send_timeout_s)

    def handle(self) -> None:
        """Serve the request, or drop a connection that timed out, stalled, was displaced
        or went away (counting the first two here; a displaced one was counted as it was)."""
        try:
            super().handle()
        except TimeoutError:
            self.server.closed.labels("timeout").inc()
        except ConnectionError:
            pass
        if self.wfile.stalled:
            self.server.closed.labels("stalled").inc()
            with contextlib.suppress(OSError):  # reset, not linger: the unsent answer is freed
                self.request.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )

    def parse_request(self) -> bool:
        """Parse the request line and headers; once they are in, the connection is being
        answered and may no longer be displaced (False: it was, just before)."""
        return super().parse_request() and self.server.answering(self._conn)

    def log_message(self, format: str, *args: Any) -> None:
        """Log nothing (one line per scrape, or per flooding client, is noise)."""


class _BoundedServer(ThreadingWSGIServer):
    """prometheus_client's thread-per-request server, with at most :attr:`max_connections`
    connections (threads) at once, displacing one waiting for its request at the cap.

    The table of open connections is guarded by a lock: the accepting thread adds to it and
    displaces, each connection's thread marks it answered and takes it out before closing
    (so a socket is never shut down once its descriptor may have been reused)."""

    closed: Counter
    max_connections = METRICS_MAX_CONNECTIONS
    request_deadline_s = METRICS_REQUEST_DEADLINE_S
    send_timeout_s = METRICS_SEND_TIMEOUT_S
    displace_after_s = DISPLACE_AFTER_S
    # the listen backlog: socketserver's 5 leaves a flood's connects in SYN retries, and
    # 64 overflowed at 2,400 connections a second (the fifteenth probe: readiness probes'
    # SYNs dropped, retried past their 1 s timeout); the kernel caps it at somaxconn
    request_queue_size = 4096

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._lock = threading.Condition()
        self._open: dict[socket.socket, _Connection] = {}
        self._leaving: set[socket.socket] = set()  # displaced, their threads not yet ended
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Hand the connection to a thread (displacing one at the cap, then waiting for its
        thread to end: never more than :attr:`max_connections` threads), or close it at once
        when all slots are taken by connections being answered or newer than
        :attr:`displace_after_s`."""
        now = time.monotonic()
        with self._lock:
            admitted = self._taken() < self.max_connections
            client = str(client_address[0]) if isinstance(client_address, tuple) else ""
            if not admitted and (self._leaving or self._displace(now, client)):
                # a displaced connection's thread ends at once: wait for its slot
                admitted = self._lock.wait_for(
                    lambda: self._taken() < self.max_connections, _LEAVE_WAIT_S
                )
            if admitted:
                self._open[request] = _Connection(request, now, client)
        if not admitted:
            self.closed.labels("limit").inc()
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.shutdown_request(request)
            raise

    def _taken(self) -> int:
        """Slots taken: connections open and displaced ones whose threads have not ended."""
        return len(self._open) + len(self._leaving)

    def _displace(self, now: float, client: str) -> bool:
        """Shut down the connection that :func:`~strata_local.slotshare.victim` picks for a
        newcomer from ``client`` (under the lock): one waiting for its request, of an address
        holding two more connections than ``client``, or waiting longest and at least
        :attr:`displace_after_s`; its thread then ends at once."""
        held = collections.Counter(conn.client for conn in self._open.values())
        waiting = [(c.client, c.accepted, c) for c in self._open.values() if not c.answering]
        oldest = victim(client, waiting, held, now, self.displace_after_s)
        if oldest is None:
            return False
        oldest.dropped = True
        del self._open[oldest.sock]
        self._leaving.add(oldest.sock)
        # wakes its thread's recv with end-of-file; that thread closes the socket
        with contextlib.suppress(OSError):  # the client has gone already
            oldest.sock.shutdown(socket.SHUT_RDWR)
        self.closed.labels("displaced").inc()
        return True

    def opened(self, request: socket.socket) -> _Connection:
        """The table's entry for ``request`` (one just displaced: marked so, not in it)."""
        with self._lock:
            conn = self._open.get(request)
        if conn is None:  # displaced before its thread started
            conn = _Connection(request, time.monotonic(), dropped=True)
        return conn

    def answering(self, conn: _Connection) -> bool:
        """Marks ``conn``'s request read: it is no longer displaced (False: it was)."""
        with self._lock:
            if conn.dropped:
                return False
            conn.answering = True
            return True

    def shutdown_request(self, request: Any) -> None:
        """Take the connection out of the table (so it is never shut down once its
        descriptor may be reused), then close it."""
        with self._lock:
            self._open.pop(request, None)
            self._leaving.discard(request)
            self._lock.notify_all()
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """One debug line instead of a traceback on stderr per failed connection."""
        logger.debug("metrics request from %s failed", client_address, exc_info=True)


def _with_readyz(app: Any, metrics: HubMetrics) -> Any:
    """``app`` with ``/readyz``: 200 while the catalog answers, else 503 (readiness probes:
    a replica that lost its catalog stops getting new connections)."""

    def dispatch(environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("PATH_INFO") != "/readyz":
            return app(environ, start_response)
        up = metrics.catalog_reachable
        body = b"ok\n" if up else b"catalog unreachable\n"
        status = "200 OK" if up else "503 Service Unavailable"
        start_response(status, [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
        return [body]

    return dispatch


class MetricsEndpoint:
    """An HTTP server exposing a registry in the Prometheus text format, on its own thread.

    Use :meth:`start`; stop with :meth:`close`.
    """

    def __init__(self, server: _BoundedServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        self.address = Address(str(server.server_address[0]), int(server.server_port))

    @classmethod
    def start(
        cls,
        listen: str,
        metrics: HubMetrics,
        *,
        max_connections: int = METRICS_MAX_CONNECTIONS,
        request_deadline_s: float = METRICS_REQUEST_DEADLINE_S,
        send_timeout_s: float = METRICS_SEND_TIMEOUT_S,
        displace_after_s: float = DISPLACE_AFTER_S,
    ) -> MetricsEndpoint:
        """Starts serving ``metrics`` on ``listen``, bounded as the module says.

        Args:
            listen: ``HOST:PORT``; port 0 picks a free port.
            metrics: The metrics to expose (and count the connections closed in).
            max_connections: Most connections open at once.
            request_deadline_s: Longest a connection may take to send its request from
                when it was accepted, seconds.
            send_timeout_s: Longest an answer may take to be sent from its first byte,
                seconds.
            displace_after_s: Least time a connection must have waited for its request,
                seconds, before one arriving at the cap may displace it.

        Returns:
            The running endpoint; ``address`` holds the bound port.

        Raises:
            InvalidArgument: ``listen`` is malformed.
            ListenError: The address cannot be bound (in use, not local).
        """
        address = Address.parse(listen)

        class Server(_BoundedServer):
            closed = metrics.metrics_connections_closed

        Server.max_connections = max_connections
        Server.request_deadline_s = request_deadline_s
        Server.send_timeout_s = send_timeout_s
        Server.displace_after_s = displace_after_s
        try:
            infos = socket.getaddrinfo(
                address.host, address.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )
            Server.address_family = infos[0][0]
            server = make_server(
                str(infos[0][4][0]),
                address.port,
                _with_readyz(make_wsgi_app(metrics.registry), metrics),
                server_class=Server,
                handler_class=_QuietHandler,
            )
        except OSError as exc:
            raise ListenError(f"cannot serve metrics on {listen}: {exc.strerror or exc}") from exc
        assert isinstance(server, _BoundedServer)
        thread = threading.Thread(target=server.serve_forever, name="strata-hub-metrics")
        thread.daemon = True
        thread.start()
        return cls(server, thread)

    def close(self) -> None:
        """Stops the server and waits for its thread."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
