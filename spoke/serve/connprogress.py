"""How far behind a client of the admin server is: what it owes (a request it has not
finished sending, answers it has not taken) and since when, read from Linux's ``TCP_INFO``
and the send queue. :mod:`spoke.serve.adminserver` displaces and resets connections by it.
"""

from __future__ import annotations

import asyncio
import fcntl
import socket
import struct
import termios

_TCP_INFO_SIZE = 128  # struct tcp_info up to tcpi_bytes_acked (a u64 at offset 120; Linux 4.1+)


class Progress:
    """One connection's progress, updated by :meth:`look` (all times monotonic, seconds).

    Attributes:
        owing_since: Since when the connection has continuously owed something on the
            client's side: a request it has not finished sending (since it opened, or since
            its last answer was all taken), or answers sent to it and not yet acknowledged;
            None while it owes nothing (its request is being handled, nothing unread). Only
            catching up resets it: all answers taken while it waits for a request (from
            then), or nothing owed at all; taking some of its answers does not.
        unread_since: Since when the client has acknowledged no byte of its answers; None
            when none wait.
        answers_since: Since when answers have waited for the client without a break;
            None when none wait.
        acked_then: Bytes the client had acknowledged at ``answers_since``.
        unread: Bytes of answers waiting for the client, when last looked at.
        acked: Bytes the client had acknowledged, when last looked at.
    """

    __slots__ = ("acked", "acked_then", "answers_since", "owing_since", "unread", "unread_since")

    def __init__(self, opened: float) -> None:
        self.owing_since: float | None = opened  # owes its first request
        self.unread_since: float | None = None
        self.answers_since: float | None = None
        self.acked_then = 0
        self.unread = 0
        self.acked = 0

    def look(self, now: float, unread: int, acked: int, waiting: bool) -> None:
        """Update with what the connection owes ``now``: ``unread`` bytes of answers wait,
        the client acknowledged ``acked`` bytes so far, and ``waiting`` (for a request it
        has not finished sending)."""
        if not unread:
            self.unread_since = self.answers_since = None
        else:
            if self.unread_since is None or acked > self.acked or unread < self.unread:
                self.unread_since = now  # waiting from now, or the client took some
            if self.answers_since is None:
                self.answers_since, self.acked_then = now, acked
        if not unread and not waiting:
            self.owing_since = None
        elif self.owing_since is None or (not unread and self.unread):
            self.owing_since = now  # owes from now: newly, or it took all and owes a request
        self.unread, self.acked = unread, acked

    def too_slow(self, now: float, after_s: float, floor: float) -> bool:
        """Whether answers have waited for the client for more than ``after_s`` seconds
        without a break while it took them at less than ``floor`` bytes a second on average
        (acknowledged since they began to wait, over the time since)."""
        if self.answers_since is None or now - self.answers_since <= after_s:
            return False
        return self.acked - self.acked_then < floor * (now - self.answers_since)


def unread_and_acked(transport: asyncio.BaseTransport) -> tuple[int, int]:
    """Bytes sent to a connection's client and not yet acknowledged by it (the transport's
    buffer and the kernel's send queue), and bytes it has acknowledged so far (Linux's
    ``TCP_INFO``; 0 elsewhere, where only the transport's buffer is seen)."""
    unread = (
        transport.get_write_buffer_size() if isinstance(transport, asyncio.WriteTransport) else 0
    )
    sock = transport.get_extra_info("socket")
    if sock is None:
        return unread, 0
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_SIZE)
        queued = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, bytes(4))
        return unread + struct.unpack("i", queued)[0], struct.unpack_from("Q", info, 120)[0]
    except (OSError, AttributeError, ValueError, struct.error):  # closed, or not Linux
        return unread, 0
