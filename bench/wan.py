"""A WAN emulator: a userspace TCP proxy with latency, a bandwidth cap, jitter and a kill switch.

    python -m bench.wan --listen 127.0.0.1:9000 --upstream 127.0.0.1:50051 \\
        [--rtt-ms 50] [--rate 1Gbit] [--jitter-ms 0]

Clients connect to the proxy instead of the server; every byte crosses an emulated link
made of two one-way pipes (client → server "up", server → client "down"). Each pipe is a
bottleneck of ``rate`` shared by all connections (a byte leaves after the bytes queued
before it, at the link rate) followed by a propagation delay of half the round-trip time,
plus an optional random jitter that never reorders a connection's bytes. A new connection
also pays one round trip before its first byte goes up (the TCP handshake), so a protocol
that opens many short connections is charged as it would be on a real WAN.

What it does not emulate: packet loss and TCP congestion control (slow start, the
congestion window). The proxy ends TCP on both sides on loopback, so figures through it
are what a perfectly tuned TCP could get from the link, an upper bound on a real WAN;
flow control above TCP (HTTP/2 windows, request/response round trips) is emulated
faithfully, because its messages cross the same delayed pipes.

:meth:`WanLink.cut` takes the link down and :meth:`WanLink.restore` brings it back. A
``"blackhole"`` cut (a pulled cable) holds every byte and every new connection until the
link returns, then delivers them in order; a ``"reset"`` cut (a restarted middlebox)
aborts every open connection and refuses new ones.

Two ways to run it: :class:`WanLink` on the caller's asyncio loop (``async with``), or
:class:`WanProxy`, the same link on a background thread for synchronous code::

    with WanProxy(("127.0.0.1", hub_port), LinkSpec(rtt_s=0.05, rate_bps=1e9)) as wan:
        run_spoke(hub=wan.address)   # "127.0.0.1:<port>"
        wan.cut(); ...; wan.restore()
        print(wan.stats().down_bytes)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import random
import re
import signal
import socket
import sys
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal, TypeVar

from protocol import address

CutMode = Literal["blackhole", "reset"]

READ_BYTES = 256 * 1024
"""Most bytes read from a socket at once; each read crosses the link as one unit."""

MIN_BUFFER_BYTES = 1024 * 1024
"""Least bytes a pipe may hold per connection before the proxy stops reading."""

_T = TypeVar("_T")


@dataclass(frozen=True)
class LinkSpec:
    """What the emulated link looks like; the same in both directions.

    Attributes:
        rtt_s: Round-trip time in seconds (each direction adds half of it).
        rate_bps: Capacity in bits per second of each direction, shared by all
            connections; ``math.inf`` for no cap.
        jitter_s: Each unit of data gets an extra one-way delay drawn uniformly from
            ``[0, jitter_s]`` seconds (order within a connection is always kept).
        buffer_bytes: Bytes a pipe holds per connection before the proxy stops reading
            from the sender; ``None`` sizes it to twice the bandwidth-delay product
            (at least :data:`MIN_BUFFER_BYTES`), enough to keep the link full.
        handshake: Charge each new connection one round trip before its first byte
            goes up, as a TCP handshake would.

    Raises:
        ValueError: From ``__post_init__`` on a negative time, a rate that is not
            positive, or a buffer smaller than one read.
    """

    rtt_s: float = 0.050
    rate_bps: float = 1e9
    jitter_s: float = 0.0
    buffer_bytes: int | None = None
    handshake: bool = True

    def __post_init__(self) -> None:
        """Check the settings.

        Raises:
            ValueError: A setting is out of range.
        """
        if not (self.rtt_s >= 0 and math.isfinite(self.rtt_s)):
            raise ValueError(f"rtt_s must be a finite number >= 0, not {self.rtt_s}")
        if not self.rate_bps > 0:
            raise ValueError(f"rate_bps must be > 0, not {self.rate_bps}")
        if not (self.jitter_s >= 0 and math.isfinite(self.jitter_s)):
            raise ValueError(f"jitter_s must be a finite number >= 0, not {self.jitter_s}")
        if self.buffer_bytes is not None and self.buffer_bytes < READ_BYTES:
            raise ValueError(f"buffer_bytes must be >= {READ_BYTES}, not {self.buffer_bytes}")

    @property
    def one_way_s(self) -> float:
        """Propagation delay of one direction, seconds (half the RTT)."""
        return self.rtt_s / 2

    @property
    def rate_bytes_per_s(self) -> float:
        """Capacity of one direction in bytes per second."""
        return self.rate_bps / 8

    @property
    def pipe_buffer_bytes(self) -> int:
        """Bytes one connection may have in one pipe before reading pauses."""
        if self.buffer_bytes is not None:
            return self.buffer_bytes
        if math.isinf(self.rate_bps):
            return 16 * MIN_BUFFER_BYTES
        bdp = self.rate_bytes_per_s * (self.rtt_s + self.jitter_s)
        return max(MIN_BUFFER_BYTES, int(2 * bdp))

    def describe(self) -> str:
        """A short human description, e.g. ``50 ms RTT, 1 Gbit/s``."""
        rate = "unlimited" if math.isinf(self.rate_bps) else format_rate(self.rate_bps)
        text = f"{self.rtt_s * 1000:g} ms RTT, {rate}"
        if self.jitter_s:
            text += f", jitter {self.jitter_s * 1000:g} ms"
        return text


@dataclass(frozen=True)
class LinkStats:
    """Counters of a link since it started.

    Attributes:
        up_bytes: Bytes delivered client → server.
        down_bytes: Bytes delivered server → client.
        connections: Connections accepted.
        open_connections: Connections open now.
        cut: Whether the link is cut now.
    """

    up_bytes: int
    down_bytes: int
    connections: int
    open_connections: int
    cut: bool


def parse_rate(text: str) -> float:
    """Bits per second from ``1Gbit``, ``100Mbit``, ``250kbit``, ``1e9`` or ``inf``.

    Raises:
        ValueError: The text is not a rate.
    """
    units = {"": 1.0, "bit": 1.0, "k": 1e3, "kbit": 1e3, "m": 1e6, "mbit": 1e6}
    units |= {"g": 1e9, "gbit": 1e9}
    match = re.fullmatch(r"\s*([0-9.eE+]+|inf)\s*([a-zA-Z]*?)(?:/s|ps)?\s*", text)
    if not match or match.group(2).lower() not in units:
        raise ValueError(f"not a rate: {text!r} (examples: 1Gbit, 100Mbit, inf)")
    value = float(match.group(1)) * units[match.group(2).lower()]
    if not value > 0:
        raise ValueError(f"rate must be > 0: {text!r}")
    return value


def format_rate(bps: float) -> str:
    """``1 Gbit/s``, ``250 Mbit/s``, ``64 kbit/s``."""
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:g} {unit}"
    return f"{bps:g} bit/s"


class _Pipe:
    """One direction of the link: a shared bottleneck queue, then a propagation delay."""

    def __init__(self) -> None:
        self.busy_until = 0.0  # loop time at which the bottleneck is free again
        self.delivered = 0

    def schedule(self, nbytes: int, now: float, spec: LinkSpec) -> float:
        """Loop time at which ``nbytes`` handed to the link at ``now`` reach the far end."""
        start = max(now, self.busy_until)
        self.busy_until = start + nbytes / spec.rate_bytes_per_s
        jitter = random.uniform(0.0, spec.jitter_s) if spec.jitter_s else 0.0
        return self.busy_until + spec.one_way_s + jitter


@dataclass(eq=False)
class _Connection:
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def abort(self) -> None:
        """Drop both sides now. Also runs when a handler that never finished is closed
        after its loop was (the proxy stopped while a connection was arriving): then the
        transports are gone with the loop and there is nothing left to drop."""
        for writer in (self.client, self.server):
            if writer is not None:
                with contextlib.suppress(RuntimeError):  # "Event loop is closed"
                    writer.transport.abort()


class WanLink:
    """The emulated link on the running asyncio loop: a TCP proxy to one upstream server.

    Args:
        upstream: The server's ``(host, port)``.
        spec: Latency, rate and jitter; change it later with :meth:`set_spec`.
        listen: Where the proxy listens; port 0 picks a free port.

    Use ``async with WanLink(...) as link`` or :meth:`start` and :meth:`aclose`.
    """

    def __init__(
        self,
        upstream: tuple[str, int],
        spec: LinkSpec | None = None,
        listen: tuple[str, int] = ("127.0.0.1", 0),
    ) -> None:
        self.upstream = upstream
        self.spec = spec or LinkSpec()
        self.listen = listen
        self._up = _Pipe()
        self._down = _Pipe()
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()
        self._accepted = 0
        self._cut: CutMode | None = None
        self._link_up = asyncio.Event()
        self._link_up.set()
        self._restored_at = -math.inf  # loop time of the latest restore()

    async def __aenter__(self) -> WanLink:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Start listening.

        Raises:
            OSError: The listen address cannot be bound.
        """
        self._server = await asyncio.start_server(
            self._handle, self.listen[0], self.listen[1], limit=READ_BYTES
        )

    @property
    def port(self) -> int:
        """The port the proxy listens on."""
        if self._server is None:
            raise RuntimeError("WanLink is not started")
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def address(self) -> str:
        """``HOST:PORT`` to give clients instead of the upstream server's."""
        return f"{self.listen[0]}:{self.port}"

    def set_spec(self, spec: LinkSpec) -> None:
        """Change latency, rate or jitter from now on (bytes already in flight keep theirs)."""
        self.spec = spec

    def cut(self, mode: CutMode = "blackhole") -> None:
        """Take the link down.

        Args:
            mode: ``"blackhole"`` holds all traffic and new connections until
                :meth:`restore`; ``"reset"`` aborts every open connection and refuses
                new ones until :meth:`restore`.
        """
        if mode not in ("blackhole", "reset"):
            raise ValueError(f"unknown cut mode {mode!r}")
        self._cut = mode
        self._link_up.clear()
        if mode == "reset":
            for conn in list(self._connections):
                conn.abort()

    def restore(self) -> None:
        """Bring the link back; held traffic resumes, at the link's rate and delay."""
        self._cut = None
        self._restored_at = asyncio.get_running_loop().time()
        self._link_up.set()

    def stats(self) -> LinkStats:
        """The byte and connection counters now."""
        return LinkStats(
            up_bytes=self._up.delivered,
            down_bytes=self._down.delivered,
            connections=self._accepted,
            open_connections=len(self._connections),
            cut=self._cut is not None,
        )

    async def aclose(self) -> None:
        """Stop listening and abort every connection."""
        if self._server is not None:
            self._server.close()
        for conn in list(self._connections):
            conn.abort()
            for task in conn.tasks:
                task.cancel()
        tasks = [t for conn in self._connections for t in conn.tasks]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
        self._connections.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        accepted_at = loop.time()
        self._accepted += 1
        if self._cut == "reset":
            writer.transport.abort()
            return
        conn = _Connection(client=writer)
        self._connections.add(conn)
        try:
            await self._link_up.wait()
            try:
                up_reader, up_writer = await asyncio.open_connection(
                    self.upstream[0], self.upstream[1], limit=READ_BYTES
                )
            except OSError:
                writer.transport.abort()
                return
            conn.server = up_writer
            _nodelay(writer)
            _nodelay(up_writer)
            # TCP's handshake: the client may send once its SYN went out and the SYN-ACK
            # came back (one RTT after connect), the server once the SYN reached it
            spec = self.spec
            rtt = spec.rtt_s if spec.handshake else 0.0
            first_up = accepted_at + rtt + spec.one_way_s
            first_down = accepted_at + rtt
            conn.tasks = [
                asyncio.create_task(self._pump(reader, up_writer, self._up, first_up, conn.abort)),
                asyncio.create_task(
                    self._pump(up_reader, writer, self._down, first_down, conn.abort)
                ),
            ]
            await asyncio.gather(*conn.tasks, return_exceptions=True)
        finally:
            conn.abort()
            self._connections.discard(conn)

    async def _pump(
        self,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        pipe: _Pipe,
        first_arrival: float,
        on_fail: Callable[[], None],
    ) -> None:
        """Move bytes from ``src`` to ``dst`` through ``pipe``; EOF is passed on too.

        Reading stops while the pipe holds :attr:`LinkSpec.pipe_buffer_bytes` of this
        connection's bytes (back-pressure) and while the link is cut. A read or write
        error aborts the whole connection through ``on_fail``.
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, float, bytes]] = asyncio.Queue()
        room = asyncio.Condition()
        state = {"in_flight": 0, "failed": 0}
        last_arrival = first_arrival

        def has_room() -> bool:
            return bool(state["failed"]) or state["in_flight"] < self.spec.pipe_buffer_bytes

        async def deliver() -> None:
            try:
                while True:
                    sent, arrival, data = await queue.get()
                    await self._link_up.wait()
                    if sent < self._restored_at:  # held by a cut: it crosses the link now
                        arrival = pipe.schedule(len(data), loop.time(), self.spec)
                    delay = arrival - loop.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    if not data:
                        if dst.can_write_eof():
                            dst.write_eof()
                        return
                    dst.write(data)
                    await dst.drain()
                    pipe.delivered += len(data)
                    async with room:
                        state["in_flight"] -= len(data)
                        room.notify()
            except (ConnectionError, OSError):
                on_fail()
                async with room:
                    state["failed"] = 1
                    room.notify()

        sender = asyncio.create_task(deliver())
        try:
            while True:
                await self._link_up.wait()
                try:
                    data = await src.read(READ_BYTES)
                except (ConnectionError, OSError):
                    on_fail()
                    return
                await self._link_up.wait()
                async with room:
                    await room.wait_for(has_room)
                    if state["failed"]:
                        return
                    state["in_flight"] += len(data)
                now = loop.time()
                arrival = max(pipe.schedule(len(data), now, self.spec), last_arrival)
                last_arrival = arrival  # never reorder a connection's bytes
                queue.put_nowait((now, arrival, data))
                if not data:
                    await sender
                    return
        finally:
            if not sender.done():
                sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender


def _nodelay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class WanProxy:
    """A :class:`WanLink` on its own event loop thread, for synchronous code.

    Args:
        upstream: The server's ``(host, port)``.
        spec: Latency, rate and jitter.
        listen: Where the proxy listens; port 0 picks a free port.

    Every method is safe to call from any thread. Use it as a context manager, or call
    :meth:`start` and :meth:`close`.
    """

    def __init__(
        self,
        upstream: tuple[str, int],
        spec: LinkSpec | None = None,
        listen: tuple[str, int] = ("127.0.0.1", 0),
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._link = WanLink(upstream, spec, listen)
        self._thread = threading.Thread(target=self._loop.run_forever, name="wan", daemon=True)
        self._started = False

    def __enter__(self) -> WanProxy:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _call(self, fn: Callable[[], Awaitable[_T]], timeout: float = 10.0) -> _T:
        async def run() -> _T:
            return await fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    def _sync(self, fn: Callable[[], _T]) -> _T:
        async def run() -> _T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10.0)

    def start(self) -> None:
        """Start the thread and listen.

        Raises:
            OSError: The listen address cannot be bound.
        """
        self._thread.start()
        self._started = True
        try:
            self._call(self._link.start)
        except BaseException:
            self.close()
            raise

    @property
    def spec(self) -> LinkSpec:
        """The link's settings now."""
        return self._link.spec

    @property
    def port(self) -> int:
        """The port the proxy listens on."""
        return self._link.port

    @property
    def address(self) -> str:
        """``HOST:PORT`` to give clients instead of the upstream server's."""
        return self._link.address

    def set_spec(self, spec: LinkSpec) -> None:
        """See :meth:`WanLink.set_spec`."""
        self._sync(lambda: self._link.set_spec(spec))

    def cut(self, mode: CutMode = "blackhole") -> None:
        """See :meth:`WanLink.cut`."""
        self._sync(lambda: self._link.cut(mode))

    def restore(self) -> None:
        """See :meth:`WanLink.restore`."""
        self._sync(self._link.restore)

    def stats(self) -> LinkStats:
        """See :meth:`WanLink.stats`."""
        return self._sync(self._link.stats)

    def close(self) -> None:
        """Abort every connection, stop listening and end the thread (idempotent)."""
        if not self._started:
            return
        self._started = False
        with contextlib.suppress(Exception):
            self._call(self._link.aclose)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10.0)
        if not self._thread.is_alive():
            self._loop.close()


def parse_hostport(text: str) -> tuple[str, int]:
    """``("127.0.0.1", 9000)`` from ``127.0.0.1:9000`` (:func:`protocol.address.parse_hostport`;
    a missing host is 127.0.0.1).

    Raises:
        ValueError: The text is not HOST:PORT.
    """
    return address.parse_hostport(text, default_host="127.0.0.1")


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.wan``: run a proxy until SIGINT/SIGTERM; prints its address."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.wan",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT (default: free)")
    parser.add_argument("--upstream", required=True, help="the server's HOST:PORT")
    parser.add_argument("--rtt-ms", type=float, default=50.0)
    parser.add_argument("--rate", default="1Gbit", help="e.g. 1Gbit, 100Mbit, inf")
    parser.add_argument("--jitter-ms", type=float, default=0.0)
    ns = parser.parse_args(argv)
    try:
        spec = LinkSpec(ns.rtt_ms / 1000, parse_rate(ns.rate), ns.jitter_ms / 1000)
        listen, upstream = parse_hostport(ns.listen), parse_hostport(ns.upstream)
    except ValueError as err:
        parser.error(str(err))
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with WanProxy(upstream, spec, listen) as wan:
        print(f"{wan.address} -> {ns.upstream} ({spec.describe()})", flush=True)
        while not stop.wait(1.0):
            pass
        stats = wan.stats()
    print(f"up {stats.up_bytes:,} B, down {stats.down_bytes:,} B, {stats.connections} conns")
    return 0


if __name__ == "__main__":
    sys.exit(main())
