"""A door for a port that Strata serves itself: connections come in through
:class:`~strata_local.doorway.Doorway` (a slot, and nothing else, until the first message
is whole), then TLS begins and the connection is handed to an asyncio stream handler. The
hub's bulk port (:mod:`hub.serve.bulk`) and the spoke's bulk peer port
(:mod:`spoke.mesh.peerbulk`) each have one.

What a TLS handshake holds: asyncio's TLS layer takes about 310 KiB a connection from the
moment it begins (its 256 KiB read buffer, OpenSSL's state), whether the caller sends
anything or not. A bulk port that began TLS on every connection holding a slot was taken
to 900 MiB of a 1 GiB hub by connections that sent part of a ClientHello (issue 39's
sixteenth probe). Here TLS begins only once a whole ClientHello record is there, and at
most :data:`HANDSHAKES` handshakes are pending at once: at that cap a newcomer's displaces
the oldest pending handshake of the address holding the most of them (its own included,
as :mod:`strata_local.doorslots` does for slots), so handshakes pending hold at most
HANDSHAKES × about 0.7 MiB (175 MiB measured under 1,200 whole ClientHellos a second,
``python -m bench.handshake_flood``; 450 MiB with TLS begun at every one of 1,024 slots),
and a flood of whole ClientHellos from many addresses leaves a real caller's handshake
HANDSHAKES ÷ (the flood's rate) seconds to finish — 0.21 s at 1,200 a second. With 64,
53 ms was too little on a busy 2-core box: 6 of 23 new clients got in.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import ssl
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from strata_local.doorslots import DoorSlot
from strata_local.doorway import Doorway, tls_hello
from strata_local.handshakes import HANDSHAKE_RATE, LOOP_LATE_S
from strata_local.knownhosts import KnownHosts
from strata_local.slotshare import Holders

HANDSHAKES = 256
"""Most TLS handshakes pending at once on one port (see the module docstring)."""

TLS_STEP_BYTES = 64 * 1024
"""Bytes written per step under TLS by :func:`write_steps`."""

Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter, DoorSlot], Awaitable[None]]
"""Serves one connection: ``(reader, writer, slot)``; it closes ``writer`` when done and
may mark ``slot`` proven (:meth:`strata_local.doorslots.DoorSlots.prove`)."""


class StreamDoor(Doorway):
    """Listens on a port and hands each connection, TLS begun, to ``serve``.

    Args:
        max_connections: Most connections open at once.
        silent_s: Longest a connection may take to send its first message, and then to
            finish its TLS handshake, seconds.
        serve: The handler (:data:`Serve`).
        head: Bytes a plaintext request's head takes at least: a caller without TLS is
            handed on once it has sent that many (whatever they are: ``serve`` answers a
            wrong one with its protocol's error).
        tls: The server's TLS context; None for plaintext.
        read_limit: Unread input buffered per connection, bytes.
        refusal: Without TLS, the bytes sent to a newcomer refused for want of a slot,
            given its address in gRPC's form (``ipv4:10.0.0.7:5000``); None: closed
            without a word (as under TLS, where no handshake is begun for it).
        handshakes: Most TLS handshakes pending at once.
        handshake_rate: Most connections handed on a second (TLS handshakes begun;
            :mod:`strata_local.handshakes`).
        known: Who proved a credential from which address lately (None: nobody yet;
            :mod:`strata_local.knownhosts`).
    """

    def __init__(
        self,
        max_connections: int,
        silent_s: float,
        serve: Serve,
        head: int,
        tls: ssl.SSLContext | None = None,
        read_limit: int = 1 << 16,
        refusal: Callable[[str], bytes] | None = None,
        handshakes: int = HANDSHAKES,
        handshake_rate: float = HANDSHAKE_RATE,
        known: KnownHosts | None = None,
    ) -> None:
        first = functools.partial(_plaintext, head) if tls is None else tls_hello
        super().__init__(max_connections, silent_s, first, handshake_rate, LOOP_LATE_S, known)
        if handshakes < 1:
            raise ValueError(f"handshakes must be at least 1, not {handshakes}")
        self._serve, self._tls, self._read_limit = serve, tls, read_limit
        self._refusal = refusal
        self.handshakes = handshakes
        self.handshakes_displaced = 0
        self._pending: Holders[DoorSlot] = Holders()
        self.pending = 0  # TLS handshakes under way

    def _refuse(self, conn: socket.socket, who: str) -> None:
        if self._tls is None and self._refusal is not None:
            with contextlib.suppress(OSError):
                conn.send(self._refusal(who), socket.MSG_DONTWAIT)
        conn.close()

    def _enter(self, conn: socket.socket, slot: DoorSlot) -> Coroutine[Any, Any, None]:
        return self._connection(conn, slot)

    async def _connection(self, conn: socket.socket, slot: DoorSlot) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=self._read_limit, loop=loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        try:
            try:
                if self._tls is not None:
                    self._begin_handshake(slot)
                transport, _ = await loop.connect_accepted_socket(
                    lambda: protocol,
                    conn,
                    ssl=self._tls,
                    ssl_handshake_timeout=self.silent_s if self._tls is not None else None,
                )
            finally:
                self._end_handshake(slot)
            if self._tls is not None:  # asyncio's TLS layer buffers 512 KiB by default
                self.slots.answer(slot)  # the client finished its handshake
                transport.set_write_buffer_limits(high=TLS_STEP_BYTES)
            writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        except (OSError, TimeoutError, asyncio.CancelledError):
            conn.close()  # a failed or displaced handshake (asyncio aborted its transport)
            self.slots.release(slot)
            return
        try:
            await self._serve(reader, writer, slot)
        except asyncio.CancelledError:
            writer.transport.abort()  # displaced, or the door closing
        finally:
            self.slots.release(slot)

    def _begin_handshake(self, slot: DoorSlot) -> None:
        """Counts ``slot``'s handshake as pending, displacing one at :attr:`handshakes`."""
        if self.pending >= self.handshakes:
            victim = self._pending.oldest_of_most()
            if victim is not None:
                self._end_handshake(victim)
                self.handshakes_displaced += 1
                victim.close()
        self._pending.add(slot.host, slot)
        self.pending += 1

    def _end_handshake(self, slot: DoorSlot) -> None:
        """Forgets ``slot``'s pending handshake, if it has one (idempotent)."""
        if slot in self._pending.by_host.get(slot.host, ()):
            self._pending.remove(slot.host, slot)
            self.pending -= 1


def _plaintext(head: int, said: bytes) -> int | None:
    """A plaintext caller's first message: ``head`` bytes, or None once it closed."""
    return head if said else None


async def write_steps(
    writer: asyncio.StreamWriter,
    data: bytes | memoryview,
    step: int,
    watch: Callable[[Awaitable[None]], Awaitable[None]] | None = None,
) -> None:
    """Writes ``data`` ``step`` bytes at a time, waiting (through ``watch``, which may
    give up on a client that takes nothing) whenever the transport's buffer is full, and
    at the end until it is below its low-water mark.

    Under TLS, pass :data:`TLS_STEP_BYTES`: asyncio encrypts what is written at once and
    hands it to the socket's transport, whose buffer its TLS layer does not count, so
    ``drain()`` returned while a whole 1 MiB write sat there, and what was counted as
    sent held 1.4 MiB a connection for a client that read nothing (one token's 1,024
    connections to a hub's bulk port: 1.5 GiB; issue 39's seventeenth probe). In small
    steps, with the TLS layer's own high-water mark at one step (the stream door sets
    it; asyncio's default is 512 KiB), both buffers hold about four steps together.
    """
    transport = writer.transport
    low, high = transport.get_write_buffer_limits()
    view = memoryview(data)
    for offset in range(0, len(view), max(1, step)):
        writer.write(view[offset : offset + step])
        if transport.get_write_buffer_size() >= high:  # drain would wait
            await (watch(writer.drain()) if watch is not None else writer.drain())
    if transport.get_write_buffer_size() > low:  # the rest leaves before it counts as sent
        await (watch(writer.drain()) if watch is not None else writer.drain())
