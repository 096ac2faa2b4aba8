"""A front door for a gRPC server's port: it accepts the connections itself, holds their
slots by :mod:`strata_local.doorslots`' shares, and relays each connection's bytes
untouched to the gRPC server behind it. The spoke's peer port
(:mod:`spoke.mesh.peerservice`) and the hub's gRPC port (:mod:`hub.serve.server`) each
have one.

gRPC core cannot choose which connection to close at its cap (it closes the newcomer), so
whoever kept its cap full with connections that never finish a handshake kept every new
caller out (issue 39's fourteenth probe on the peer port, 40 of 40 new peers refused; the
fifteenth on the hub, about 300 silent connections a second refused most new spokes);
and Python's gRPC cannot be handed a socket. So the door sits in front: gRPC serves on a
Unix socket in a directory only this process can open (``mkdtemp``, 0700), and the door
relays each connection to it — TLS and HTTP/2 still end at gRPC, the door never reads a
byte of them. The relay is ``splice(2)`` through a pipe per direction: the bytes go socket
to pipe to socket inside the kernel, never into Python (one call per pipeful each way).

Each relayed connection binds a unique abstract name the kernel picks before it connects,
so gRPC's ``context.peer()`` (``unix-abstract:NAME``) names the door's connection:
:meth:`Door.who` gives the caller's real address for limits, audit
lines and logs, and :meth:`Door.prove` marks the connection proven once a call on it
carried an accepted token.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import logging
import os
import shutil
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from strata_local.doorslots import DoorSlot, DoorSlots

log = logging.getLogger(__name__)

PIPE_BYTES = 1 << 20
"""Most bytes one ``splice(2)`` call moves, and the size asked for the pipe of answers
(``F_SETPIPE_SZ``; the kernel's ``pipe-max-size``, 1 MiB, by default): blocks leave in
fewer, larger moves. Where the user's pipe pages are spent it stays at 64 KiB."""

ACCEPT_BATCH = 64
"""Most connections accepted in one turn of the event loop (the rest wait for the next:
the mount's calls are served between batches)."""

SWEEP_S = 1.0
"""How often connections that have sent nothing are looked at, seconds."""

ENDING = 64
"""Most displaced connections still ending (their descriptors not yet closed) before the
door stops accepting until they have: a flood waits in the kernel's backlog rather than
taking the daemon's descriptors."""

_SPLICE = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
"""HTTP/2's client connection preface (RFC 9113, 3.4): a plaintext gRPC client's first bytes."""

TLS_HANDSHAKE = 0x16
"""A TLS record's content type for a handshake message (RFC 8446, 5.1): a ClientHello's."""

FIRST_MESSAGE_MOST = 5 + (1 << 14) + 256
"""Most bytes of a first message the door waits for: a TLS record's 5-byte header and at
most 2^14 bytes of plaintext fragment (RFC 8446, 5.1), with room to spare."""


def _first_message(said: bytes) -> int | None:
    """How many bytes the first message that begins with ``said`` takes (more than
    ``len(said)`` when it is not whole yet), or None when it is neither a TLS handshake
    record nor HTTP/2's preface, or the caller closed (``said`` empty)."""
    if not said:
        return None
    if said[0] == TLS_HANDSHAKE:
        if len(said) < 5:
            return 5
        length = 5 + int.from_bytes(said[3:5], "big")
        return length if length <= FIRST_MESSAGE_MOST else None
    if PREFACE.startswith(said[: len(PREFACE)]):
        return len(PREFACE)
    return None


def peer_name(address: Any) -> str:
    """gRPC's form of a TCP peer address (``ipv4:10.0.0.7:5000``, ``ipv6:[::1]:5000``), so
    an audit line reads the same whichever port or channel the call came on (the doors,
    the hub's and the spokes' bulk ports)."""
    if isinstance(address, tuple) and len(address) >= 2:
        host, port = address[0], address[1]
        return f"ipv6:[{host}]:{port}" if ":" in str(host) else f"ipv4:{host}:{port}"
    return f"unknown:{address}"


class _Arrival:
    """An accepted connection whose first message is not whole yet: it holds a slot and a
    socket, no relay, no task (a flood of connections that send nothing, or a part of a
    message, costs the door one accept, one slot and one registration each)."""

    __slots__ = ("conn", "since", "slot")

    def __init__(self, conn: socket.socket, since: float) -> None:
        self.conn, self.since = conn, since
        self.slot: DoorSlot | None = None


class Door:
    """Listens on a port and relays each connection to the gRPC server behind it.

    A connection is accepted, given a slot and watched for its first message, all in one
    callback of the event loop, up to :data:`ACCEPT_BATCH` at a time; only a caller whose
    first message is whole — a TLS ClientHello's record, or HTTP/2's preface — gets a relay
    (a task, the Unix socket to gRPC, two pipes). One that has not sent it within
    ``silent_s`` is closed, as gRPC closes one that does not finish its handshake.

    Args:
        max_connections: Most connections open at once.
        credentials: Whether callers have something to prove (a token, or client
            certificates): without, no connection is kept over another (:meth:`prove`
            does nothing) and every slot is shared by address.
        silent_s: Longest a connection may send nothing before it is closed, seconds.

    Attributes:
        backend: The gRPC server's address (``unix:PATH``) to bind before :meth:`start`.
        slots: The connection slots and their counts.
    """

    def __init__(self, max_connections: int, credentials: bool, silent_s: float) -> None:
        self.slots = DoorSlots(max_connections)
        self.credentials, self.silent_s = credentials, silent_s
        self._dir = Path(tempfile.mkdtemp(prefix="strata-door-"))  # 0700: ours alone
        self._backend = self._dir / "grpc.sock"
        self.backend = f"unix:{self._backend}"
        self._by_name: dict[str, DoorSlot] = {}  # "unix-abstract:<our socket's name>" -> slot
        self._listener: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._arrivals: dict[_Arrival, None] = {}  # silent so far, in arrival order
        self._sweep: asyncio.TimerHandle | None = None
        self._resume: asyncio.TimerHandle | None = None
        self._open: set[asyncio.Task[None]] = set()
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        """Listens on ``host:port`` (port 0: a free one); returns the bound port.

        Raises:
            OSError: the address cannot be bound.
        """
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((host, port))
            listener.listen(socket.SOMAXCONN)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self._listener, self._loop = listener, asyncio.get_running_loop()
        self.port = int(listener.getsockname()[1])
        self._loop.add_reader(listener.fileno(), self._accept)
        self._sweep = self._loop.call_later(SWEEP_S, self._close_silent)
        return self.port

    def who(self, peer: str) -> str:
        """The caller behind gRPC's ``context.peer()`` (``peer`` itself when it is not one
        of the door's connections)."""
        slot = self._by_name.get(peer)
        return peer if slot is None else slot.who

    def prove(self, peer: str) -> None:
        """Keeps the connection behind ``peer`` (``context.peer()``): a call on it carried
        an accepted token (or passed mTLS where there are no tokens)."""
        slot = self._by_name.get(peer)
        if slot is not None and self.credentials:
            self.slots.prove(slot)

    async def close(self) -> None:
        """Stops accepting, ends every connection and removes the door's directory
        (idempotent)."""
        for timer in (self._sweep, self._resume):
            if timer is not None:
                timer.cancel()
        self._sweep = self._resume = None
        if self._listener is not None and self._loop is not None:
            self._loop.remove_reader(self._listener.fileno())
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        for arrival in list(self._arrivals):
            self._end_arrival(arrival)
        for task in list(self._open):
            task.cancel()
        if self._open:
            await asyncio.gather(*self._open, return_exceptions=True)
        shutil.rmtree(self._dir, ignore_errors=True)

    def _accept(self) -> None:
        """The listener is readable: accept up to :data:`ACCEPT_BATCH` connections."""
        assert self._listener is not None and self._loop is not None
        loop, now = self._loop, self._loop.time()
        for _ in range(ACCEPT_BATCH):
            if len(self._open) >= self.slots.max_connections + ENDING:
                self._pause(0.001)  # displaced relays still ending: the backlog waits
                return
            try:
                conn, address = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as err:  # EMFILE and the like: wait, then go on accepting
                log.warning("door of port %d cannot accept: %s", self.port, err)
                self._pause(0.1)
                return
            conn.setblocking(False)
            arrival = _Arrival(conn, now)
            slot = self.slots.take(
                str(address[0]), peer_name(address), functools.partial(self._end_arrival, arrival)
            )
            if slot is None:
                conn.close()  # every slot is held by a proven peer: as gRPC core would
                continue
            arrival.slot = slot
            self._arrivals[arrival] = None
            loop.add_reader(conn.fileno(), self._first_bytes, arrival)

    def _pause(self, seconds: float) -> None:
        assert self._listener is not None and self._loop is not None
        fd = self._listener.fileno()
        self._loop.remove_reader(fd)
        self._resume = self._loop.call_later(seconds, self._loop.add_reader, fd, self._accept)

    def _first_bytes(self, arrival: _Arrival) -> None:
        """The caller sent something (or closed): once its first message is whole — a TLS
        record (a ClientHello) or HTTP/2's connection preface — relay the connection from
        now on. Until then the kernel holds its bytes (``SO_RCVLOWAT`` wakes the door only
        when the rest is there), and anything else ends it: a caller that sends one byte
        costs no more than one that sends none (the sixteenth probe kept new peers out
        with 1,800 one-byte connections a second when a byte bought a relay)."""
        assert self._loop is not None and arrival.slot is not None
        conn = arrival.conn
        try:
            said = conn.recv(FIRST_MESSAGE_MOST, socket.MSG_PEEK)
        except OSError:
            said = b""  # reset
        need = _first_message(said)
        if need is None:  # closed, or neither TLS nor HTTP/2: nothing gRPC would take
            self._end_arrival(arrival)
            return
        if len(said) < need:
            with contextlib.suppress(OSError):
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, need)
            return
        with contextlib.suppress(OSError):
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
        self._loop.remove_reader(conn.fileno())
        del self._arrivals[arrival]
        task = asyncio.create_task(self._relay(conn, arrival.slot))
        arrival.slot.close = _ender(task, conn)
        self._open.add(task)
        task.add_done_callback(self._open.discard)

    def _end_arrival(self, arrival: _Arrival) -> None:
        """Closes a connection not relayed yet (displaced, without a whole first message
        for :attr:`silent_s`, or the door closing), and frees its slot."""
        if self._arrivals.pop(arrival, False) is None and self._loop is not None:
            self._loop.remove_reader(arrival.conn.fileno())
            arrival.conn.close()
        if arrival.slot is not None:
            self.slots.release(arrival.slot)

    def _close_silent(self) -> None:
        """Closes the connections silent for :attr:`silent_s` (oldest first: the arrivals
        are in order), every :data:`SWEEP_S`."""
        assert self._loop is not None
        too_old = self._loop.time() - self.silent_s
        while self._arrivals:
            arrival = next(iter(self._arrivals))
            if arrival.since > too_old:
                break
            self._end_arrival(arrival)
        self._sweep = self._loop.call_later(SWEEP_S, self._close_silent)

    async def _relay(self, conn: socket.socket, slot: DoorSlot) -> None:
        """Relays one connection for as long as both ends keep it."""
        upstream: socket.socket | None = None
        name = ""
        pipes: list[int] = []
        try:
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            upstream.setblocking(False)
            upstream.bind("")  # the kernel's own unique abstract name: no file to make
            name = "unix-abstract:" + upstream.getsockname()[1:].decode()  # gRPC's form
            self._by_name[name] = slot
            await asyncio.get_running_loop().sock_connect(upstream, str(self._backend))
            for _ in range(2):
                pipes.extend(os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK))
            with contextlib.suppress(OSError):  # beyond the user's pipe pages: 64 KiB
                fcntl.fcntl(pipes[3], fcntl.F_SETPIPE_SZ, PIPE_BYTES)  # answers: blocks
            inbound = asyncio.create_task(_pump(conn, upstream, pipes[0], pipes[1]))
            outbound = asyncio.create_task(_pump(upstream, conn, pipes[2], pipes[3]))
            # the connection lasts while gRPC keeps its end (a caller that has said all
            # it will still reads the answers), or until the caller's end fails
            inbound.add_done_callback(lambda t: _failed(t) and outbound.cancel())
            try:
                await outbound
            finally:
                inbound.cancel()
                outbound.cancel()
                await asyncio.gather(inbound, outbound, return_exceptions=True)
        except (OSError, asyncio.CancelledError):
            pass  # either end went away, or the slot was displaced: the connection ends
        finally:
            self.slots.release(slot)
            self._by_name.pop(name, None)
            for fd in pipes:
                os.close(fd)
            if upstream is not None:
                upstream.close()
            conn.close()


def _ender(task: asyncio.Task[None], conn: socket.socket) -> Callable[[], None]:
    """Ends a displaced connection: both directions shut at once (the caller sees the end
    now), its task cancelled to close the descriptors."""

    def end() -> None:
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_RDWR)
        task.cancel()

    return end


def _failed(task: asyncio.Task[None]) -> bool:
    return task.cancelled() or task.exception() is not None


async def _pump(src: socket.socket, dst: socket.socket, pipe_r: int, pipe_w: int) -> None:
    """Moves ``src``'s bytes to ``dst`` through the pipe until ``src`` ends, then ends
    ``dst``'s writing side (half-close, as TCP does).

    Raises:
        OSError: either socket failed (reset, broken pipe).
    """
    loop = asyncio.get_running_loop()
    source, sink = src.fileno(), dst.fileno()
    while True:
        try:
            moved = os.splice(source, pipe_w, PIPE_BYTES, flags=_SPLICE)
        except BlockingIOError:
            await _ready(loop.add_reader, loop.remove_reader, source)
            continue
        if moved == 0:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
            return
        while moved:
            try:
                moved -= os.splice(pipe_r, sink, moved, flags=_SPLICE)
            except BlockingIOError:
                await _ready(loop.add_writer, loop.remove_writer, sink)


async def _ready(add: Any, remove: Any, fd: int) -> None:
    """Waits until ``fd`` is ready (``add``/``remove``: the loop's reader or writer pair)."""
    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def ready() -> None:
        if not waiter.done():
            waiter.set_result(None)

    add(fd, ready)
    try:
        await waiter
    finally:
        remove(fd)
