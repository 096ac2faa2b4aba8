"""Where a port's connections come in before anything is spent on them: a listener whose
connections are accepted in batches, given a slot by :mod:`strata_local.doorslots`' shares
and watched, as bare sockets, until their first message is whole; only then is a
connection handed on. :class:`strata_local.door.Door` hands it to a gRPC server behind (the
spoke's peer port, the hub's gRPC port), :class:`strata_local.streamdoor.StreamDoor` to an
asyncio stream handler, TLS begun there (the hub's bulk port, the spoke's bulk peer port).

A connection that has sent nothing, or part of a first message, costs one accept, one slot
and one registration with the event loop: no task, no buffer, no TLS state. The kernel
holds its bytes (``SO_RCVLOWAT`` wakes the doorway only when the rest is there), and one
that sends something no server behind would take is closed at once (issue 39's sixteenth
probe kept new peers out with 1,800 one-byte connections a second while a byte bought a
relay).

A connection whose first message is whole begins its handshake (is handed on) only when
:mod:`strata_local.handshakes` gives it a turn: at most a rate a second, taken in turns by
address, addresses that proved a credential first; until then it waits in its slot, a bare
socket still.

The slots and the turns count callers by address (:func:`caller_address`), a
dual-stack listener's IPv4 callers by their IPv4 address. Not by an IPv6 address's /64,
though one host may send from any address of the /64 it is routed: a fleet of spokes
often shares one (a cloud subnet's, a node's pods'), and counted as one caller it was
the network holding most, whose connections every flood arrival displaced first (issue
39's twenty-second probe: 248 of 500 such spokes back 26 s after a hub restart under
4,000 ClientHellos a second, against all 500 after 12 s counted by address). A flood
from one /64 is as one from as many addresses as it sends connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import logging
import socket
from collections.abc import Callable, Coroutine
from typing import Any

from strata_local.doorslots import DoorSlot, DoorSlots
from strata_local.handshakes import HANDSHAKE_RATE, LATE_S, PACE_S, HandshakeTurns
from strata_local.knownhosts import KnownHosts

log = logging.getLogger(__name__)

ACCEPT_BATCH = 64
"""Most connections accepted in one turn of the event loop (the rest wait for the next:
the mount's calls are served between batches)."""

SWEEP_S = 1.0
"""How often connections that have sent nothing are looked at, seconds."""

ENDING = 64
"""Most displaced connections still ending (their descriptors not yet closed) beyond the
slots before the doorway stops accepting until they have: a flood waits in the kernel's
backlog rather than taking the daemon's descriptors."""

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
"""HTTP/2's client connection preface (RFC 9113, 3.4): a plaintext gRPC client's first bytes."""

TURN_S = 0.005
"""Least time between two looks at the handshakes waiting for a turn, seconds (a few begin
at each at the rate)."""

TLS_HANDSHAKE = 0x16
"""A TLS record's content type for a handshake message (RFC 8446, 5.1): a ClientHello's."""

FIRST_MESSAGE_MOST = 5 + (1 << 14) + 256
"""Most bytes of a first message a doorway waits for: a TLS record's 5-byte header and at
most 2^14 bytes of plaintext fragment (RFC 8446, 5.1), with room to spare."""

FirstMessage = Callable[[bytes], "int | None"]
"""How many bytes the first message that begins with the bytes given takes (more than
their length when it is not whole yet), or None when no server behind would take it."""


def tls_hello(said: bytes) -> int | None:
    """A TLS client's first message (:data:`FirstMessage`): one whole handshake record,
    its ClientHello, of at most :data:`FIRST_MESSAGE_MOST` bytes."""
    if not said or said[0] != TLS_HANDSHAKE:
        return None
    if len(said) < 5:
        return 5
    length = 5 + int.from_bytes(said[3:5], "big")
    return length if length <= FIRST_MESSAGE_MOST else None


def starts_with(magic: bytes) -> FirstMessage:
    """A plaintext protocol's first message (:data:`FirstMessage`): its ``magic`` bytes."""

    def first(said: bytes) -> int | None:
        if not said or not magic.startswith(said[: len(magic)]):
            return None
        return len(magic)

    return first


def grpc_first(said: bytes) -> int | None:
    """A gRPC client's first message (:data:`FirstMessage`): a TLS ClientHello's record,
    or HTTP/2's connection preface."""
    if said and said[0] == TLS_HANDSHAKE:
        return tls_hello(said)
    return starts_with(PREFACE)(said)


def caller_address(host: str) -> str:
    """The address that stands for a caller in a doorway's slots and turns (see the
    module).

    Args:
        host: A peer's address as the socket gives it (``10.0.0.7``, ``2001:db8::7``,
            ``::ffff:10.0.0.7`` on a dual-stack listener).

    Returns:
        An IPv4-mapped IPv6 address as its IPv4 address (``10.0.0.7``); anything else as
        it is.
    """
    if not host.startswith("::ffff:"):
        return host
    try:
        mapped = ipaddress.IPv6Address(host).ipv4_mapped
    except ValueError:
        return host
    return host if mapped is None else str(mapped)


def peer_name(address: Any) -> str:
    """gRPC's form of a TCP peer address (``ipv4:10.0.0.7:5000``, ``ipv6:[::1]:5000``), so
    an audit line reads the same whichever port or channel the call came on (the doors,
    the hub's and the spokes' bulk ports)."""
    if isinstance(address, tuple) and len(address) >= 2:
        host, port = address[0], address[1]
        return f"ipv6:[{host}]:{port}" if ":" in str(host) else f"ipv4:{host}:{port}"
    return f"unknown:{address}"


class _Arrival:
    """An accepted connection not handed on yet: a slot and a socket, and whether its
    first message is whole (it waits for its handshake's turn)."""

    __slots__ = ("conn", "since", "slot", "whole")

    def __init__(self, conn: socket.socket, since: float) -> None:
        self.conn, self.since = conn, since
        self.slot: DoorSlot | None = None
        self.whole = False


class Doorway:
    """Accepts a port's connections and hands on each whose first message is whole.

    A connection is accepted, given a slot and watched for its first message, all in one
    callback of the event loop, up to :data:`ACCEPT_BATCH` at a time. One whose first
    message is whole runs :meth:`_enter` in a task of its own once its handshake has a
    turn (:class:`~strata_local.handshakes.HandshakeTurns`); one that has not been handed
    on within ``silent_s`` is closed.

    Args:
        max_connections: Most connections open at once.
        silent_s: Longest a connection may take to send its first message and have its
            turn, seconds.
        first_message: What a connection's first message is (:data:`FirstMessage`).
        handshake_rate: Most connections handed on a second (handshakes begun); fewer
            while the event loop runs late (:meth:`HandshakeTurns.pace
            <strata_local.handshakes.HandshakeTurns.pace>`).
        late_s: How late the loop may run before that rate falls, seconds.
        known: Who proved a credential from which address lately (None: nobody yet;
            :mod:`strata_local.knownhosts`).

    Raises:
        ValueError: ``max_connections`` below 1 or ``handshake_rate`` not positive.

    Attributes:
        slots: The connection slots and their counts.
        turns: The handshakes waiting for a turn, and their counts.
        port: The bound port (after :meth:`start`).
    """

    def __init__(
        self,
        max_connections: int,
        silent_s: float,
        first_message: FirstMessage,
        handshake_rate: float = HANDSHAKE_RATE,
        late_s: float = LATE_S,
        known: KnownHosts | None = None,
    ) -> None:
        self.slots = DoorSlots(max_connections, known)
        self.turns: HandshakeTurns[_Arrival] = HandshakeTurns(
            handshake_rate, self.slots.known, late_s=late_s
        )
        self.silent_s, self._first_message = silent_s, first_message
        self._listener: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._arrivals: dict[_Arrival, None] = {}  # not handed on yet, in order
        self._sweep: asyncio.TimerHandle | None = None
        self._resume: asyncio.TimerHandle | None = None
        self._turn: asyncio.TimerHandle | None = None
        self._pace: asyncio.TimerHandle | None = None
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
        self._pace = self._loop.call_later(PACE_S, self._pace_turns, self._loop.time() + PACE_S)
        return self.port

    @property
    def connections(self) -> int:
        """Connections handed on and not yet ended."""
        return len(self._open)

    async def close(self) -> None:
        """Stops accepting and ends every connection (idempotent)."""
        for timer in (self._sweep, self._resume, self._turn, self._pace):
            if timer is not None:
                timer.cancel()
        self._sweep = self._resume = self._turn = self._pace = None
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

    def _enter(self, conn: socket.socket, slot: DoorSlot) -> Coroutine[Any, Any, None]:
        """What a connection whose first message is whole gets (its first message still
        unread in the kernel): a coroutine that serves it, closes ``conn`` and releases
        ``slot`` when done. Cancelled when the slot is displaced or the doorway closes."""
        raise NotImplementedError

    def _refuse(self, conn: socket.socket, who: str) -> None:
        """A newcomer for which no slot may be displaced: closed (a subclass may first
        send a one-line refusal)."""
        conn.close()

    def _accept(self) -> None:
        """The listener is readable: accept up to :data:`ACCEPT_BATCH` connections."""
        assert self._listener is not None and self._loop is not None
        loop, now = self._loop, self._loop.time()
        for _ in range(ACCEPT_BATCH):
            if len(self._open) >= self.slots.max_connections + ENDING:
                self._pause(0.001)  # displaced connections still ending: the backlog waits
                return
            try:
                conn, address = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as err:  # EMFILE and the like: wait, then go on accepting
                log.warning("port %d cannot accept: %s", self.port, err)
                self._pause(0.1)
                return
            conn.setblocking(False)
            arrival = _Arrival(conn, now)
            who = peer_name(address)
            slot = self.slots.take(
                caller_address(str(address[0])), who, functools.partial(self._end_arrival, arrival)
            )
            if slot is None:
                self._refuse(conn, who)  # every slot is held by a proven caller
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
        """The caller sent something (or closed): once its first message is whole, hand the
        connection on when its handshake has a turn; anything that is not the start of one
        ends it."""
        assert self._loop is not None and arrival.slot is not None
        conn = arrival.conn
        try:
            said = conn.recv(FIRST_MESSAGE_MOST, socket.MSG_PEEK)
        except OSError:
            said = b""  # reset
        need = self._first_message(said)
        if need is None:  # closed, or nothing the server behind would take
            self._end_arrival(arrival)
            return
        if len(said) < need:
            with contextlib.suppress(OSError):
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, need)
            return
        with contextlib.suppress(OSError):
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
        self._loop.remove_reader(conn.fileno())
        arrival.whole = True
        if self.turns.offer(arrival.slot.host, arrival):
            self._hand_on(arrival)
        elif self._turn is None:
            self._take_turns()

    def _hand_on(self, arrival: _Arrival) -> None:
        """Runs :meth:`_enter` for ``arrival``, whose handshake has its turn."""
        assert arrival.slot is not None
        del self._arrivals[arrival]
        task = asyncio.create_task(self._enter(arrival.conn, arrival.slot))
        arrival.slot.close = _ender(task, arrival.conn)
        self._open.add(task)
        task.add_done_callback(self._open.discard)
        task.add_done_callback(functools.partial(self._cancelled_early, arrival))

    def _cancelled_early(self, arrival: _Arrival, task: asyncio.Task[None]) -> None:
        """A handed-on connection's task is done. :meth:`_enter`'s coroutines end their
        connection and free its slot themselves, cancelled or not; a task cancelled
        before its first step (the doorway closing, or the slot displaced, just after
        its turn came) never ran them, so its socket is closed and its slot freed here
        (a component test's door kept one slot after closing, now and then)."""
        if task.cancelled() and arrival.slot is not None:
            arrival.conn.close()
            self.slots.release(arrival.slot)

    def _take_turns(self) -> None:
        """Hands on the connections whose turn is due, and looks again when the next is."""
        assert self._loop is not None
        self._turn = None
        for arrival in self.turns.due():
            self._hand_on(arrival)
        wait = self.turns.wait_s()
        if wait is not None:
            self._turn = self._loop.call_later(max(wait, TURN_S), self._take_turns)

    def _pace_turns(self, due: float) -> None:
        """Tells the turns how late this timer ran (due at ``due``), every :data:`PACE_S`."""
        assert self._loop is not None
        now = self._loop.time()
        self.turns.pace(now - due)
        self._pace = self._loop.call_later(PACE_S, self._pace_turns, now + PACE_S)

    def _end_arrival(self, arrival: _Arrival) -> None:
        """Closes a connection not handed on yet (displaced, silent for
        :attr:`silent_s`, or the doorway closing), and frees its slot."""
        if self._arrivals.pop(arrival, False) is None and self._loop is not None:
            if arrival.whole:
                self.turns.withdraw(arrival)
            else:
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


def _ender(task: asyncio.Task[None], conn: socket.socket) -> Callable[[], None]:
    """Ends a displaced connection: both directions shut at once (the caller sees the end
    now), its task cancelled to close the descriptors."""

    def end() -> None:
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_RDWR)
        task.cancel()

    return end
