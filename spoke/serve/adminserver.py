"""The admin API's HTTP server: uvicorn on a socket the daemon bound, with bounds on what
a client that sends nothing (or sends it slowly), or reads nothing, may hold.

uvicorn times out a connection only after a response (``timeout_keep_alive``); a
connection that never completes a request is kept forever, and so is one whose client never
reads its response (uvicorn waits for the transport to drain, with no timeout); its
``limit_concurrency`` answers requests with 503 but never refuses a connection. So the
daemon serves with :class:`AdminProtocol`, uvicorn's own HTTP/1.1 protocol (h11) with:

- a cap on open connections (:data:`spoke.serve.limits.ADMIN_MAX_CONNECTIONS`, fitted under
  the daemon's open-file limit; 32 on the ``--metrics`` port). A connection arriving at the
  cap first displaces one of an address holding two more connections than its own (one, if
  its own holds none; fair shares by address, :class:`strata_local.slotshare.Ledger`,
  constant time an arrival: one address's
  flood never keeps the kubelet out), else the open one that has owed something the longest,
  if that is at least :data:`DISPLACE_AFTER_S`: owing is waiting for a request the client
  has not finished sending, or answers sent to it and not yet taken, without a break; only
  catching up ends it (all answers taken), not taking some
  (:class:`~spoke.serve.connprogress.Progress`). An honest client owes for milliseconds; a
  slow reader of pipelined answers owes for good and goes first, however often it takes a
  little. A connection whose request is being handled, nothing unread, is never displaced.
  With none owing that long the newcomer is closed as it arrives, nothing read;
- a request timeout, :data:`REQUEST_TIMEOUT_S`: a connection that has not sent a whole
  request (headers and body) that long after it opened, or after its last response, is
  closed (slowloris; Apache's ``mod_reqtimeout`` and nginx's ``client_header_timeout``
  do the same). uvicorn's keep-alive timeout (:data:`KEEP_ALIVE_S`) still closes an idle
  keep-alive connection sooner;
- a write-stall timeout, :data:`WRITE_STALL_S`: a connection whose client has taken (TCP
  acknowledged) no byte of what waits for it that long is aborted, and what it held freed
  at once (nginx's ``send_timeout``). What waits is the transport's buffer and the
  kernel's send queue: the kernel takes megabytes of pipelined answers for a client that
  reads none, before uvicorn's transport ever pauses writing. A watch looks every half
  :data:`DISPLACE_AFTER_S` while anything waits; a client reading slowly but steadily is kept.
  A client whose answers have waited without a break for more than :data:`WRITE_STALL_S`
  and that took them at under :data:`MIN_RATE` on average is aborted too (a response rate
  floor, like Apache's ``mod_reqtimeout`` ``MinRate`` for requests): taking a little now
  and then does not hold a connection for good.
  A pipelined request is taken up only once at most :data:`PIPELINE_UNREAD` of answers
  wait, so a client that reads nothing costs a few answers' work, not one per request.

All are counted (``strata_spoke_admin_connections_closed_total{reason}``: ``limit``,
``displaced``, ``timeout``, ``stalled``, ``slow``) and logged at
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
import struct
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from protocol.address import parse_hostport
from spoke import metrics
from spoke.serve.connprogress import Progress, unread_and_acked
from spoke.serve.limits import ADMIN_MAX_CONNECTIONS
from strata_local.audit import TokenBucket
from strata_local.slotshare import Ledger

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 10.0
"""Longest a client may take to send a whole request, seconds (the largest, an 8 MiB hint
post, takes milliseconds from the node or its cluster)."""

WRITE_STALL_S = 10.0
"""Longest a client may leave what is sent to it waiting without taking a byte of it,
seconds; then the connection is aborted and its unsent bytes freed (a 4 MB pin list unread
held them for good, and the connection a slot under the cap)."""

MIN_RATE = 16 << 10
"""Least average rate, bytes a second, at which a client must take answers that have waited
for it without a break for more than :data:`WRITE_STALL_S`; slower, the connection is
aborted (the probe's slow readers took 3.4 KB/s each; a 4 MB pin list at this rate takes
4 minutes)."""

DISPLACE_AFTER_S = 0.05
"""Least time a connection must have owed something without a break (a request it has not
finished sending, or answers it has not all taken), seconds, before one arriving at the cap
may displace it (an honest client sends its request and takes its answer in milliseconds;
taking part of its answers does not end owing, only taking all of them). Short, because
the oldest owing connection goes first: a client opening silent connections faster than
the cap over this (640 a second on the 32 of ``--metrics``) is needed to keep a newcomer
out, where 1 s let 50 a second keep the kubelet's probe out 9 times in a row (the twelfth
probe). That holds among addresses within one connection of each other; an address holding
more gives up its connections at any age (:mod:`strata_local.slotshare`), so one address
cannot keep another out at any rate (the thirteenth probe's 1,200 a second did)."""

WRITE_CHECKS = 4
"""How many times per :data:`WRITE_STALL_S` a connection with bytes waiting for its client is
looked at for progress (a connection arriving at the cap looks at every open one afresh, so
displacement does not wait for these)."""

PIPELINE_UNREAD = 4 << 10
"""Most bytes of answers that may wait for a client (unacknowledged) when its next pipelined
request is taken up; with more, that request waits until the client has taken them (the
daemon answered pipelined requests into the kernel's send queue, megabytes, for clients
that read none). Clients that do not pipeline never wait on it."""

HOLD_CHECK_S = 0.05
"""How often a connection whose pipelined request waits looks whether its client has taken
its answers, seconds."""

KEEP_ALIVE_S = 5
"""uvicorn's keep-alive timeout: an idle connection after a response is closed, seconds."""

LOG_EVERY_S = 60.0
"""Least time between two log lines about closed connections, seconds."""

BACKLOG = 128
"""How many pending connections asyncio accepts per loop pass (each costs the loop a
fraction of a millisecond: a deeper batch would stall the mount's calls behind a flood)."""

LISTEN_BACKLOG = 4096
"""The kernel's queue of connections not yet accepted (``listen(2)``, capped by
``net.core.somaxconn``), set once uvicorn has listened with :data:`BACKLOG`: a flood's
connections queue rather than have their SYNs dropped, since a dropped SYN is sent again
a second later, past a kubelet probe's timeout (the fifteenth probe: 129 of 128 queued,
175,000 overflows, at 2,400 connections a second)."""

_ACCEPT_FAILED = "socket.accept() out of system resource"


class AdminProtocol(H11Protocol):
    """uvicorn's h11 protocol with a cap on open connections (displacing the one owing
    longest), a request timeout, and a write-stall timeout with a response rate floor.

    uvicorn makes one per connection; :func:`admin_config` sets the class attributes. It
    has more than 15 methods because it hooks five of uvicorn's callbacks and keeps two
    timers (the request deadline; the write watch, which also lets a pipelined request held
    back go on), each armed and disarmed by its own.
    """

    max_connections: ClassVar[int] = ADMIN_MAX_CONNECTIONS
    request_timeout_s: ClassVar[float] = REQUEST_TIMEOUT_S
    write_stall_s: ClassVar[float] = WRITE_STALL_S
    displace_after_s: ClassVar[float] = DISPLACE_AFTER_S
    min_rate: ClassVar[float] = MIN_RATE
    _closed: ClassVar[dict[str, int]] = {}  # since the last log line, by reason
    _ledger: ClassVar[Ledger[AdminProtocol]] = Ledger()  # the open ones, for fair shares
    _logged: ClassVar[float] = float("-inf")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._refused = False
        self._deadline: asyncio.TimerHandle | None = None
        self._progress = Progress(time.monotonic())  # what the client owes, since when
        self._watch: asyncio.TimerHandle | None = None  # looks at the unread bytes' progress
        self._held = False  # a pipelined request waits for the client to take its answers
        self._client = ""  # the client's address (its host), for fair shares at the cap
        self._engaged = False  # a request has begun on it (answers may have been written)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Serve the connection; at the cap, displace one for it (an address's over its fair
        share, else the one owing longest: :func:`strata_local.slotshare.victim`), or close
        it at once when there is none."""
        peer = transport.get_extra_info("peername")
        self._client = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        if len(self.connections) >= self.max_connections and not self._displace():
            self._refused = True
            transport.abort()
            self._count("limit")
            return
        super().connection_made(transport)
        self._ledger.add(self._client, self)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        """The connection ended (nothing to undo for one refused at the cap)."""
        if self._refused:
            return
        self._ledger.remove(self)
        self._disarm()
        self._unwatch()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        """A response went out: the next request gets its own timeout, and the write watch
        looks after the response until the client has taken it. A pipelined request already
        here waits while more than :data:`PIPELINE_UNREAD` of answers wait for the client."""
        if self._hold_pipelined():
            return  # the write watch calls this again once the client has taken enough
        super().on_response_complete()
        self._arm()
        self._observe()

    def handle_events(self) -> None:
        """Parse what the client sent; a request taken up with nothing unread ends owing."""
        super().handle_events()
        if not self._refused:
            self._observe()

    def pause_writing(self) -> None:
        """The transport holds more than its high-water mark unsent: watch it (resuming is
        progress the watch sees: the client took bytes)."""
        super().pause_writing()
        self._observe()

    def _hold_pipelined(self) -> bool:
        """Whether the next request, pipelined, must wait for the client to take its answers."""
        self._held = False
        if self.transport.is_closing() or not self.conn.trailing_data[0]:
            return False
        if self._observe().unread > PIPELINE_UNREAD:
            self._held = True
            self._unwatch()  # look again soon (HOLD_CHECK_S), not in a watch period
            self._observe()
        return self._held

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
        if not self.transport.is_closing() and self._waiting_for_request():
            self.transport.close()  # what is still unsent stays under the write watch
            self._count("timeout")

    def _waiting_for_request(self) -> bool:
        # IDLE: no whole header yet (h11 leaves IDLE only then); SEND_BODY: body unfinished
        return self.conn.their_state in (h11.IDLE, h11.SEND_BODY)

    def _unwatch(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None

    def _look(self) -> None:
        """The write watch: abort a connection whose client took nothing of what waits for
        it for :attr:`write_stall_s` (``stalled``), or whose answers waited longer than that
        while it took them at under :attr:`min_rate` on average (``slow``; ``stalled`` if
        it has taken nothing for half :attr:`write_stall_s`, as a client that reads nothing
        has); look again later while anything waits."""
        self._watch = None
        progress, now = self._observe(), time.monotonic()
        if progress.unread_since is not None and now - progress.unread_since >= self.write_stall_s:
            self._drop("stalled")
        elif progress.too_slow(now, self.write_stall_s, self.min_rate):
            idle = now - (progress.unread_since or now) >= self.write_stall_s / 2
            self._drop("stalled" if idle else "slow")
        elif self._held and progress.unread <= PIPELINE_UNREAD:
            self.on_response_complete()  # the pipelined request held back goes on

    def _observe(self) -> Progress:
        """What the client owes now (its answers in the transport's buffer or the kernel's:
        the kernel takes megabytes for a client that reads nothing, and whether it owes a
        request). Arms the write watch while any answers wait. A connection that has never
        begun a request has had nothing written to it: it is not asked (two system calls a
        connection, for every arrival at the cap, took 64 % of a flooded daemon's time and
        left its backlog full: the fourteenth probe)."""
        if self.cycle is not None:
            self._engaged = True  # a request began: answers may be written from now on
        unread, acked = unread_and_acked(self.transport) if self._engaged else (0, 0)
        waiting = not self.transport.is_closing() and self._waiting_for_request()
        self._progress.look(time.monotonic(), unread, acked, waiting)
        if unread and self._watch is None and not self._refused:
            every = self.write_stall_s / WRITE_CHECKS
            every = min(every, HOLD_CHECK_S) if self._held else every
            self._watch = self.loop.call_later(every, self._look)
        return self._progress

    def _displace(self) -> bool:
        """Abort the connection that :meth:`~strata_local.slotshare.Ledger.victim` picks for
        this newcomer: of an address holding two more connections than this one's, or owing
        longest and at least :attr:`displace_after_s`; whether there was one (at most
        :data:`~strata_local.slotshare.INSPECT` connections asked what they owe)."""
        chosen = self._ledger.victim(
            self._client, _owing_since, time.monotonic(), self.displace_after_s
        )
        if chosen is None:
            return False
        chosen._drop("displaced")
        return True

    def _drop(self, reason: str) -> None:
        """Abort the connection with a reset, its unsent bytes freed at once (a plain close
        leaves the kernel's send queue to go out, for good to a client that reads nothing),
        and count it; it leaves the connections counted against the cap now, not when
        asyncio reports it lost."""
        self._disarm()
        self._unwatch()
        self.connections.discard(self)
        self._ledger.remove(self)
        sock = self.transport.get_extra_info("socket")
        with contextlib.suppress(OSError, AttributeError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()
        self._count(reason)

    @classmethod
    def _count(cls, reason: str) -> None:
        metrics.ADMIN_CONNECTIONS_CLOSED.labels(reason).inc()
        cls._closed[reason] = cls._closed.get(reason, 0) + 1
        now = time.monotonic()
        if now - cls._logged >= LOG_EVERY_S:
            counts = ", ".join(f"{n} {why}" for why, n in sorted(cls._closed.items()))
            log.warning(
                "admin API: closed connections unserved (%s) since the last line; at most "
                "%d open, %g s to send a request, %g s to take a byte of a response, "
                "%d B/s to take them after that",
                counts,
                cls.max_connections,
                cls.request_timeout_s,
                cls.write_stall_s,
                cls.min_rate,
            )
            cls._closed = {}
            cls._logged = now


def _owing_since(conn: AdminProtocol) -> float | None:
    """Since when ``conn`` has owed something (None: nothing)."""
    if conn.transport is None:
        return None
    return conn._observe().owing_since


def admin_config(
    app: Any,
    max_connections: int = ADMIN_MAX_CONNECTIONS,
    request_timeout_s: float = REQUEST_TIMEOUT_S,
    write_stall_s: float = WRITE_STALL_S,
    displace_after_s: float = DISPLACE_AFTER_S,
    min_rate: float = MIN_RATE,
) -> uvicorn.Config:
    """The uvicorn configuration of the admin API (an ASGI ``app``) with these bounds.

    Args:
        app: The ASGI application.
        max_connections: Most connections open at once.
        request_timeout_s: Longest to send a whole request, seconds.
        write_stall_s: Longest to take no byte of a response held back, seconds.
        displace_after_s: Least time a connection must have owed something without a break,
            seconds, before one arriving at the cap may displace it.
        min_rate: Least average rate, bytes a second, of taking answers that have waited for
            more than ``write_stall_s``.
    """
    protocol = type(
        "AdminProtocol",
        (AdminProtocol,),
        {
            "max_connections": max_connections,
            "request_timeout_s": request_timeout_s,
            "write_stall_s": write_stall_s,
            "displace_after_s": displace_after_s,
            "min_rate": min_rate,
            "_closed": {},
            "_ledger": Ledger(),
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

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's start, then each socket's queue deepened to :data:`LISTEN_BACKLOG`
        (asyncio listened with :data:`BACKLOG`, its accepts per loop pass)."""
        await super().startup(sockets=sockets)
        for sock in sockets or ():
            sock.listen(LISTEN_BACKLOG)


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
