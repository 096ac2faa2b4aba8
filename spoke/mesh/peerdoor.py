"""The gRPC peer port's front door: it accepts the region's connections itself, holds
their slots by :mod:`spoke.mesh.doorslots`' shares, and relays each connection's bytes
untouched to the gRPC server behind it.

gRPC core cannot choose which connection to close at its cap (it closes the newcomer), and
Python's gRPC cannot be handed a socket, so the door sits in front: gRPC serves on a Unix
socket in a directory only this daemon can open (``mkdtemp``, 0700), and the door relays
each accepted TCP connection to it — TLS and HTTP/2 still end at gRPC, the door never
reads a byte of them. The relay is ``splice(2)`` through a pipe per direction: the bytes
go socket to pipe to socket inside the kernel, never into Python (one call per pipeful
each way).

Each relayed connection binds its own socket path before it connects (and unlinks it
once connected: the name stays on the socket), so gRPC's ``context.peer()`` names the
door's connection: :meth:`PeerDoor.who` gives the caller's real address for limits, audit
lines and logs, and :meth:`PeerDoor.prove` marks the connection proven once a call on it
carried the region's token.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import logging
import os
import shutil
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spoke.mesh.doorslots import DoorSlot, DoorSlots
from spoke.mesh.transport import MAX_CONNECTIONS

log = logging.getLogger(__name__)

PIPE_BYTES = 1 << 20
"""Most bytes one ``splice(2)`` call moves, and the size asked for the pipe of answers
(``F_SETPIPE_SZ``; the kernel's ``pipe-max-size``, 1 MiB, by default): blocks leave in
fewer, larger moves. Where the user's pipe pages are spent it stays at 64 KiB."""

ENDING = 64
"""Most displaced connections still ending (their descriptors not yet closed) before the
door stops accepting until they have: a flood waits in the kernel's backlog rather than
taking the daemon's descriptors."""

_SPLICE = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK


def grpc_peer(address: Any) -> str:
    """gRPC's form of a TCP peer address (``ipv4:10.0.0.7:5000``, ``ipv6:[::1]:5000``)."""
    if isinstance(address, tuple) and len(address) >= 2:
        host, port = address[0], address[1]
        return f"ipv6:[{host}]:{port}" if ":" in str(host) else f"ipv4:{host}:{port}"
    return f"unknown:{address}"


class PeerDoor:
    """Listens on the peer port and relays each connection to gRPC behind it.

    Args:
        max_connections: Most connections open at once (``--peer-max-connections``).
        credentials: Whether callers have something to prove (the region's token, or
            client certificates): without, no connection is kept over another
            (:meth:`prove` does nothing) and every slot is shared by address.

    Attributes:
        backend: The gRPC server's address (``unix:PATH``) to bind before :meth:`start`.
        slots: The connection slots and their counts.
    """

    def __init__(self, max_connections: int = MAX_CONNECTIONS, credentials: bool = True) -> None:
        self.slots = DoorSlots(max_connections)
        self.credentials = credentials
        self._dir = Path(tempfile.mkdtemp(prefix="strata-peer-"))  # 0700: ours alone
        self._backend = self._dir / "grpc.sock"
        self.backend = f"unix:{self._backend}"
        self._names = itertools.count()
        self._by_name: dict[str, DoorSlot] = {}  # "unix:<our socket's path>" -> its slot
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
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
        self._listener = listener
        self.port = int(listener.getsockname()[1])
        self._accepting = asyncio.create_task(self._accept(listener), name="peer door")
        return self.port

    def who(self, peer: str) -> str:
        """The caller behind gRPC's ``context.peer()`` (``peer`` itself when it is not one
        of the door's connections)."""
        slot = self._by_name.get(peer)
        return peer if slot is None else slot.who

    def prove(self, peer: str) -> None:
        """Keeps the connection behind ``peer`` (``context.peer()``): a call on it carried
        the region's token."""
        slot = self._by_name.get(peer)
        if slot is not None and self.credentials:
            self.slots.prove(slot)

    async def close(self) -> None:
        """Stops accepting, ends every relayed connection and removes the door's directory."""
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
        if self._listener is not None:
            self._listener.close()
        for task in list(self._open):
            task.cancel()
        if self._open:
            await asyncio.gather(*self._open, return_exceptions=True)
        shutil.rmtree(self._dir, ignore_errors=True)

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        most = self.slots.max_connections + ENDING
        while True:
            while len(self._open) >= most:  # displaced ones still ending: the backlog waits
                await asyncio.sleep(0.001)
            try:
                conn, address = await loop.sock_accept(listener)
            except OSError as err:  # EMFILE and the like: wait, then go on accepting
                log.warning("peer door cannot accept: %s", err)
                await asyncio.sleep(0.1)
                continue
            task = asyncio.create_task(self._connection(conn, address))
            self._open.add(task)
            task.add_done_callback(self._open.discard)

    async def _connection(self, conn: socket.socket, address: Any) -> None:
        """Relays one accepted connection for as long as both ends keep it."""
        task = asyncio.current_task()
        assert task is not None
        slot = self.slots.take(str(address[0]), grpc_peer(address), _ender(task, conn))
        if slot is None:
            conn.close()  # every slot is held by a proven peer: as gRPC core would
            return
        upstream: socket.socket | None = None
        name = str(self._dir / f"c{next(self._names)}")
        pipes: list[int] = []
        try:
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            upstream.setblocking(False)
            upstream.bind(name)
            self._by_name[f"unix:{name}"] = slot
            await asyncio.get_running_loop().sock_connect(upstream, str(self._backend))
            os.unlink(name)
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
            self._by_name.pop(f"unix:{name}", None)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name)
            for fd in pipes:
                os.close(fd)
            if upstream is not None:
                upstream.close()
            conn.close()


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
