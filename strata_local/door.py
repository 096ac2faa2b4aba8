"""A front door for a gRPC server's port: it accepts the connections itself
(:mod:`strata_local.doorway`), holds their slots by :mod:`strata_local.doorslots`' shares,
and relays each connection's bytes untouched to the gRPC server behind it. The spoke's peer port
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
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strata_local.doorslots import DoorSlot
from strata_local.doorway import Doorway, grpc_first
from strata_local.knownhosts import KnownHosts

log = logging.getLogger(__name__)

PIPE_BYTES = 1 << 20
"""Most bytes one ``splice(2)`` call moves, and the size asked for a pipe of answers while
its connection moves more than a pipeful at a time (``F_SETPIPE_SZ``; the kernel's
``pipe-max-size``, 1 MiB, by default): blocks leave in fewer, larger moves."""

GROW_AFTER = 4
"""Moves in a row, each finding more to move, before a pipe of answers grows."""

PIPE_IDLE_BYTES = 4096
"""The size of each pipe while its connection is not moving a pipeful at a time (one
page). A user without ``CAP_SYS_RESOURCE`` (the hub's container, uid 10001) has 16,384
pipe pages (``/proc/sys/fs/pipe-user-pages-soft``) before every new pipe gets 2: with a
1 MiB pipe of answers for every connection the first 60 spent them all (the twenty-first
probe), while two pages a connection leave 12,288 for 48 busy ones of 2,048."""

NOTHING_SAID, SERVER_SAID, CALLER_ANSWERED, ANSWER_TAKEN = range(4)
"""How far a relayed connection's caller and server have talked (:attr:`_Talk.state`):
the server's first flight; the caller's bytes after it; the server's bytes after those,
which make the caller answered (:meth:`Door._said`)."""

FIRST_FLIGHT_LEAST = 256
"""Bytes the server must have sent before a caller's bytes count as an answer to its
first flight: a TLS 1.3 server's ServerHello to Finished carries a certificate (hundreds
of bytes), a HelloRetryRequest about 100. Else a canned second ClientHello answered a
HelloRetryRequest, and the server's real flight after it counted as speaking again: a
flood computing nothing had 893 of 900 connections counted answered (the twenty-third
probe's N1). A resumed handshake, with no certificate, may send less: its caller is then
not counted answered before its call proves it, as before there was an answered rank."""

_SPLICE = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK


@dataclass(slots=True)
class _Talk:
    """How far a relayed connection's caller and server have talked, and the bytes the
    server sent while its first flight was not yet out."""

    state: int = NOTHING_SAID
    server_bytes: int = 0


class Door(Doorway):
    """Listens on a port and relays each connection to the gRPC server behind it.

    Connections come in through :class:`~strata_local.doorway.Doorway`: only a caller
    whose first message is whole — a TLS ClientHello's record, or HTTP/2's preface
    (:func:`~strata_local.doorway.grpc_first`) — gets a relay (a task, the Unix socket to
    gRPC, two pipes). One that has not sent it within ``silent_s`` is closed, as gRPC
    closes one that does not finish its handshake.

    Args:
        max_connections: Most connections open at once.
        credentials: Whether callers have something to prove (a token, or client
            certificates): without, no connection is kept over another (:meth:`prove`
            does nothing) and every slot is shared by address.
        silent_s: Longest a connection may send nothing before it is closed, seconds.
        known: Who proved a credential from which address lately (None: nobody yet;
            :mod:`strata_local.knownhosts`; a hub passes the one it keeps in its data
            directory).

    Attributes:
        backend: The gRPC server's address (``unix:PATH``) to bind before :meth:`start`.
        slots: The connection slots and their counts.
    """

    def __init__(
        self,
        max_connections: int,
        credentials: bool,
        silent_s: float,
        known: KnownHosts | None = None,
    ) -> None:
        super().__init__(max_connections, silent_s, grpc_first, known=known)
        self.credentials = credentials
        self._dir = Path(tempfile.mkdtemp(prefix="strata-door-"))  # 0700: ours alone
        self._backend = self._dir / "grpc.sock"
        self.backend = f"unix:{self._backend}"
        self._by_name: dict[str, DoorSlot] = {}  # "unix-abstract:<our socket's name>" -> slot

    def who(self, peer: str) -> str:
        """The caller behind gRPC's ``context.peer()`` (``peer`` itself when it is not one
        of the door's connections)."""
        slot = self._by_name.get(peer)
        return peer if slot is None else slot.who

    def prove(self, peer: str, holder: str) -> None:
        """Keeps the connection behind ``peer`` (``context.peer()``): a call on it carried
        an accepted token (or passed mTLS where there are no tokens) of ``holder`` (the
        token's subject: shares are kept by it as well as by address)."""
        slot = self._by_name.get(peer)
        if slot is not None and self.credentials:
            self.slots.prove(slot, holder)

    def unprove(self, peer: str) -> None:
        """Takes back the proof of the connection behind ``peer``: a call on it carried no
        accepted token (revoked since it proved one): it may be displaced again."""
        slot = self._by_name.get(peer)
        if slot is not None:
            self.slots.unprove(slot)

    async def close(self) -> None:
        """Stops accepting, ends every connection and removes the door's directory
        (idempotent)."""
        await super().close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def _enter(self, conn: socket.socket, slot: DoorSlot) -> Coroutine[Any, Any, None]:
        return self._relay(conn, slot)

    def _used(self, slot: DoorSlot, talk: _Talk, moved: int) -> None:
        """The caller behind ``slot`` sent ``moved`` bytes
        (:meth:`~strata_local.doorslots.DoorSlots.used`), an answer if the server had
        said its first flight (:data:`SERVER_SAID`)."""
        assert self._loop is not None
        if talk.state == SERVER_SAID:
            talk.state = CALLER_ANSWERED
        self.slots.used(slot, self._loop.time())

    def _said(self, slot: DoorSlot, talk: _Talk, moved: int) -> None:
        """The server sent ``slot``'s caller ``moved`` bytes: once it has sent
        :data:`FIRST_FLIGHT_LEAST`, its first flight is out;
        after the caller's answer to that, the answer was one it accepts (a TLS
        handshake's Finished: gRPC speaks HTTP/2 only once it has checked it; five bytes
        promising a record that never comes get nothing more), and the caller counts as
        answered (:meth:`~strata_local.doorslots.DoorSlots.answer`)."""
        if talk.state == NOTHING_SAID:
            talk.server_bytes += moved
            if talk.server_bytes >= FIRST_FLIGHT_LEAST:
                talk.state = SERVER_SAID
        elif talk.state == CALLER_ANSWERED:
            talk.state = ANSWER_TAKEN
            self.slots.answer(slot)

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
            try:  # a local socket connects at once, unless gRPC's backlog is full
                upstream.connect(str(self._backend))
            except (BlockingIOError, InterruptedError):
                await asyncio.get_running_loop().sock_connect(upstream, str(self._backend))
            for _ in range(2):
                pipes.extend(os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK))
                _resize(pipes[-1], PIPE_IDLE_BYTES)
            talk = _Talk()
            used = functools.partial(self._used, slot, talk)
            said = functools.partial(self._said, slot, talk)
            inbound = asyncio.create_task(_pump(conn, upstream, pipes[0], pipes[1], used))
            outbound = asyncio.create_task(_pump(upstream, conn, pipes[2], pipes[3], said, True))
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


def _failed(task: asyncio.Task[None]) -> bool:
    return task.cancelled() or task.exception() is not None


def _resize(pipe: int, size: int) -> int:
    """Asks for ``pipe``'s size (bytes); returns its size after (the kernel rounds up to
    pages; beyond the user's pipe pages it refuses: the size stays)."""
    try:
        return int(fcntl.fcntl(pipe, fcntl.F_SETPIPE_SZ, size))
    except OSError:
        return int(fcntl.fcntl(pipe, fcntl.F_GETPIPE_SZ))


async def _pump(
    src: socket.socket,
    dst: socket.socket,
    pipe_r: int,
    pipe_w: int,
    moved_some: Callable[[int], None] | None = None,
    grow: bool = False,
) -> None:
    """Moves ``src``'s bytes to ``dst`` through the pipe until ``src`` ends, then ends
    ``dst``'s writing side (half-close, as TCP does); ``moved_some`` is called with the
    size of each move, bytes. With ``grow``, the pipe grows to :data:`PIPE_BYTES` once
    :data:`GROW_AFTER` moves in a row found ``src`` with more to give (a page-sized pipe
    takes a fragment of a message at a time), and shrinks to :data:`PIPE_IDLE_BYTES`
    (empty) when ``src`` has nothing more for now.

    Raises:
        OSError: either socket failed (reset, broken pipe).
    """
    loop = asyncio.get_running_loop()
    source, sink = src.fileno(), dst.fileno()
    size, streak = PIPE_IDLE_BYTES, 0
    while True:
        try:
            moved = os.splice(source, pipe_w, PIPE_BYTES, flags=_SPLICE)
        except BlockingIOError:
            streak = 0
            if size > PIPE_IDLE_BYTES:  # drained: its pages back to the user's others
                size = _resize(pipe_w, PIPE_IDLE_BYTES)
            await _ready(loop.add_reader, loop.remove_reader, source)
            continue
        streak += 1
        if grow and streak == GROW_AFTER and size < PIPE_BYTES:
            size = _resize(pipe_w, PIPE_BYTES)  # answers keep coming: blocks, say
        if moved and moved_some is not None:
            moved_some(moved)
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
