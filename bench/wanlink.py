"""The WAN emulator's engine (:class:`WanLink`) on the caller's asyncio loop: the two
one-way pipes, each a shared bottleneck then a propagation delay, the proxied
connections, and cutting and restoring the link. :mod:`bench.wan` describes the model and
runs the same link on a thread (:class:`bench.wan.WanProxy`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType

from bench.wanspec import READ_BYTES, CutMode, LinkSpec, LinkStats


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
