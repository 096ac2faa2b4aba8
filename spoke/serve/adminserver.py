"""The admin API's HTTP server: uvicorn on a socket the daemon bound, with bounds on what
a client that sends nothing (or sends it slowly) may hold.

uvicorn times out a connection only after a response (``timeout_keep_alive``); a
connection that never completes a request is kept forever, and its
``limit_concurrency`` answers requests with 503 but never refuses a connection. So the
daemon serves with :class:`AdminProtocol`, uvicorn's own HTTP/1.1 protocol (h11) with:

- a cap on open connections (:data:`spoke.serve.limits.ADMIN_MAX_CONNECTIONS`, fitted under the
  daemon's open-file limit): one beyond it is closed as it arrives, nothing read;
- a request timeout, :data:`REQUEST_TIMEOUT_S`: a connection that has not sent a whole
  request (headers and body) that long after it opened, or after its last response, is
  closed (slowloris; Apache's ``mod_reqtimeout`` and nginx's ``client_header_timeout``
  do the same). uvicorn's keep-alive timeout (:data:`KEEP_ALIVE_S`) still closes an idle
  keep-alive connection sooner.

Both are counted (``strata_spoke_admin_connections_closed_total{reason}``) and logged at
most once a minute. What could still flood the log is rate-limited:
asyncio's "socket.accept() out of system resource" (CPython logs it once per pending
connection, with a traceback, on every loop pass while descriptors run out:
:func:`quiet_accept_errors`) and uvicorn's warnings about malformed requests
(:class:`RateLimited`). ``/metrics`` is served here too, so Prometheus scrapes share the
cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from protocol.address import parse_hostport
from spoke import metrics
from spoke.serve.limits import ADMIN_MAX_CONNECTIONS
from strata_local.audit import TokenBucket

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 10.0
"""Longest a client may take to send a whole request, seconds (the largest, an 8 MiB hint
post, takes milliseconds from the node or its cluster)."""

KEEP_ALIVE_S = 5
"""uvicorn's keep-alive timeout: an idle connection after a response is closed, seconds."""

LOG_EVERY_S = 60.0
"""Least time between two log lines about closed connections, seconds."""

BACKLOG = 128
"""The listen backlog, and how many pending connections asyncio accepts per loop pass."""

_ACCEPT_FAILED = "socket.accept() out of system resource"


class AdminProtocol(H11Protocol):
    """uvicorn's h11 protocol with a cap on open connections and a request timeout.

    uvicorn makes one per connection; :func:`admin_config` sets the class attributes.
    """

    max_connections: ClassVar[int] = ADMIN_MAX_CONNECTIONS
    request_timeout_s: ClassVar[float] = REQUEST_TIMEOUT_S
    _closed: ClassVar[dict[str, int]] = {}  # since the last log line, by reason
    _logged: ClassVar[float] = float("-inf")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._refused = False
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Serve the connection, or close it at once when the cap is reached."""
        if len(self.connections) >= self.max_connections:
            self._refused = True
            transport.abort()
            self._count("limit")
            return
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        """The connection ended (nothing to undo for one refused at the cap)."""
        if self._refused:
            return
        self._disarm()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        """A response went out: the next request gets its own timeout."""
        super().on_response_complete()
        self._arm()

    def _arm(self) -> None:
        self._disarm()
        if not self.transport.is_closing():
            self._deadline = self.loop.call_later(self.request_timeout_s, self._expire)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self) -> None:
        self._deadline = None
        # IDLE: no whole header yet (h11 leaves IDLE only then); SEND_BODY: body unfinished
        if not self.transport.is_closing() and self.conn.their_state in (h11.IDLE, h11.SEND_BODY):
            self.transport.close()
            self._count("timeout")

    @classmethod
    def _count(cls, reason: str) -> None:
        metrics.ADMIN_CONNECTIONS_CLOSED.labels(reason).inc()
        cls._closed[reason] = cls._closed.get(reason, 0) + 1
        now = time.monotonic()
        if now - cls._logged >= LOG_EVERY_S:
            counts = ", ".join(f"{n} {why}" for why, n in sorted(cls._closed.items()))
            log.warning(
                "admin API: closed connections unserved (%s) since the last line; at most "
                "%d open, %g s to send a request",
                counts,
                cls.max_connections,
                cls.request_timeout_s,
            )
            cls._closed = {}
            cls._logged = now


def admin_config(
    app: Any,
    max_connections: int = ADMIN_MAX_CONNECTIONS,
    request_timeout_s: float = REQUEST_TIMEOUT_S,
) -> uvicorn.Config:
    """The uvicorn configuration of the admin API (an ASGI ``app``) with these bounds."""
    protocol = type(
        "AdminProtocol",
        (AdminProtocol,),
        {
            "max_connections": max_connections,
            "request_timeout_s": request_timeout_s,
            "_closed": {},
            "__doc__": AdminProtocol.__doc__,
        },
    )
    return uvicorn.Config(
        app,
        http=protocol,
        ws="none",
        lifespan="off",
        log_level="warning",
        timeout_keep_alive=KEEP_ALIVE_S,
        backlog=BACKLOG,
    )


class AdminServer(uvicorn.Server):
    """uvicorn on a socket we bound ourselves, leaving signal handling to the daemon."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """The daemon owns SIGINT/SIGTERM; uvicorn must not install handlers."""
        yield


def bind(listen: str) -> socket.socket:
    """Bind a TCP listening socket for ``HOST:PORT`` (port 0 picks a free port).

    Raises:
        ValueError: ``listen`` is not HOST:PORT.
        OSError: the address is in use or not local.
    """
    try:
        host, port = parse_hostport(listen, default_host="127.0.0.1")
    except ValueError:
        raise ValueError(f"admin address must be HOST:PORT, got {listen!r}") from None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(BACKLOG)
    sock.set_inheritable(True)
    return sock


class RateLimited(logging.Filter):
    """Lets ``rate`` records a second through (bursts of ``burst``); says how many it held
    back on the next one it lets through.

    Args:
        rate: Records per second on average.
        burst: Records at once.
    """

    def __init__(self, rate: float = 1.0, burst: int = 10) -> None:
        super().__init__()
        self._bucket = TokenBucket(rate, burst)
        self.dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether ``record`` is logged."""
        if not self._bucket.take():
            self.dropped += 1
            return False
        if self.dropped:
            record.msg = f"{record.msg} ({self.dropped} such lines left out)"
            self.dropped = 0
        return True


def quiet_accept_errors(loop: asyncio.AbstractEventLoop, every_s: float = LOG_EVERY_S) -> None:
    """Log asyncio's accept failures (out of descriptors) as one line per ``every_s``
    seconds with a count, instead of a traceback per pending connection; every other
    exception goes to the loop's handler as before."""
    previous = loop.get_exception_handler()
    state = {"logged": float("-inf"), "quiet": 0}

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") != _ACCEPT_FAILED:
            if previous is not None:
                previous(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        now = time.monotonic()
        if now - state["logged"] < every_s:
            state["quiet"] += 1
            return
        log.error(
            "cannot accept connections: %s (%d more times since the last line)",
            context.get("exception"),
            state["quiet"],
        )
        state["logged"], state["quiet"] = now, 0

    loop.set_exception_handler(handler)


def install_log_limits() -> None:
    """Rate-limit uvicorn's per-request warnings (malformed requests, unsupported upgrades)."""
    logging.getLogger("uvicorn.error").addFilter(RateLimited())
