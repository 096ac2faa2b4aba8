"""The receive side of the bulk block channel (:mod:`protocol.bulk`), shared by the hub's
(:mod:`spoke.hublink.bulk`) and the region's peers' (:mod:`spoke.mesh.bulkclient`) bulk
sources.

A call runs in a receive thread: it reads reply frames with few system calls
(:class:`Frames`), takes each block into a page-aligned buffer the thread re-uses
(:class:`Buffers`; the one copy, by the kernel), verifies it (xxh3-128 releases the GIL)
and stages it to its temporary file (:func:`receive_block`), and hands the event loop
what it got through a :class:`Handoff`: the loop only admits.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import mmap
import socket
import threading
import time
from collections.abc import Callable

from spoke import metrics
from spoke.cache.staging import DIRECT_MIN_BYTES, Staged
from spoke.cache.store import Received
from spoke.disk.layout import block_digest
from spoke.errors import CorruptBlock

log = logging.getLogger(__name__)

Stage = Callable[[str, memoryview, bool], Staged]
"""Writes a verified block to its temporary file: ``(digest, bytes, direct)``
(:meth:`spoke.cache.store.BlockStore.stage`)."""

READ_AHEAD = 256 << 10
"""Most bytes one ``recv`` reads ahead of the frame being parsed (:class:`Frames`)."""

AHEAD_BYTES = 16 << 20
"""Most bytes of one call's blocks received (and staged) that the loop has not yet taken
(the fetcher's ``ADMIT_AHEAD_BYTES``)."""

END = object()
"""What a receive thread hands over after a call's last block."""


class Handoff:
    """What one call's receive thread hands the event loop: blocks ``(digest, Received)``,
    other items, then :data:`END` (or an error).

    The thread appends under a lock and wakes the loop only when the loop waits for it
    (one ``call_soon_threadsafe`` for a run of blocks, not one per block). It waits while
    the blocks the loop has not taken reach :data:`AHEAD_BYTES`, so a loop slow to admit
    holds back the receive (and what is staged on disk ahead of admission) instead of
    letting a whole batch pile up."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.items: collections.deque[object] = collections.deque()
        self.lock = threading.Lock()
        self.room = threading.Condition(self.lock)
        self.ahead = 0
        self.waiter: asyncio.Future[None] | None = None
        self.cancelled = False
        self.sock: socket.socket | None = None
        self.address = ""  # HOST:PORT dialled, for messages

    def put(self, item: object) -> None:
        """Appends ``item`` (from the thread), after waiting for room for a block."""
        size = len(item[1]) if isinstance(item, tuple) else 0
        with self.lock:
            while self.ahead and self.ahead + size > AHEAD_BYTES and not self.cancelled:
                self.room.wait()
            self.items.append(item)
            self.ahead += size
            waiter, self.waiter = self.waiter, None
        if waiter is not None:
            self.loop.call_soon_threadsafe(_wake, waiter)

    async def get(self) -> object:
        """The next item (on the loop), waiting for the thread when there is none."""
        while True:
            with self.lock:
                if self.items:
                    item = self.items.popleft()
                    if isinstance(item, tuple):
                        self.ahead -= len(item[1])
                        self.room.notify()
                    return item
                self.waiter = self.loop.create_future()
                waiter = self.waiter
            await waiter

    def cancel(self) -> None:
        """Ends a call the loop stopped waiting for: its socket is shut down, so a
        blocked receive returns at once, and a thread waiting for room goes on."""
        with self.lock:
            self.cancelled = True
            sock = self.sock
            self.room.notify_all()
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def discard(self) -> None:
        """Deletes the staged files of blocks handed over and never taken (on the loop,
        after the thread is done)."""
        for item in self.items:
            if isinstance(item, tuple) and isinstance(item[1], Staged):
                item[1].discard()


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Buffers:
    """Each receive thread's page-aligned receive buffer (``O_DIRECT`` needs the
    alignment), grown by doubling to the largest block seen."""

    def __init__(self) -> None:
        self._local = threading.local()

    def get(self, size: int) -> memoryview:
        """This thread's buffer, ``size`` bytes of it."""
        buffer: mmap.mmap | None = getattr(self._local, "mmap", None)
        if buffer is None or len(buffer) < size:
            capacity = max(size, 2 * len(buffer) if buffer is not None else 0, 1 << 16)
            # the old buffer is not closed here: a view of it may still be held (a block
            # handed on as bytes of it); it goes with its last view
            buffer = mmap.mmap(-1, -(-capacity // mmap.PAGESIZE) * mmap.PAGESIZE)
            self._local.mmap = buffer
        return memoryview(buffer)[:size]


def receive_block(
    frames: Frames,
    buffers: Buffers,
    digest: str,
    length: int,
    direct: bool,
    stage: Stage | None,
) -> Received:
    """The ``length`` bytes of block ``digest`` that follow an OK frame's head, verified;
    staged when ``stage`` is given (``direct``: with ``O_DIRECT`` if it is large enough).

    Returns:
        The block's :class:`~spoke.cache.staging.Staged` file, or its bytes (no
        ``stage``, or staging failed: e.g. ENOSPC, and the cache decides what to do).

    Raises:
        CorruptBlock: the bytes do not match ``digest`` (counted in
            ``strata_spoke_corrupt_blocks_total``).
        EOFError, TimeoutError, OSError: as :meth:`Frames.take`.
    """
    direct = direct and length >= DIRECT_MIN_BYTES
    if length <= READ_AHEAD and not direct:
        view = frames.take(length)  # small: out of the read-ahead, no copy
    else:
        view = buffers.get(length)  # page-aligned, as O_DIRECT needs
        frames.into(view)
    if block_digest(view) != digest:
        metrics.CORRUPT_BLOCKS.inc()
        raise CorruptBlock(f"block {digest} failed verification")
    if stage is None:
        return bytes(view)
    try:
        return stage(digest, view, direct)
    except OSError as err:
        log.debug("staging block %s failed (%s); handing it over in memory", digest, err)
        return bytes(view)


def peer_of(sock: socket.socket) -> str:
    """``HOST:PORT`` a connected socket dials ('' once it is closed)."""
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return ""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Frames:
    """A connection's reply frames with few system calls: each ``recv`` takes up to
    :data:`READ_AHEAD` bytes, so the heads and bytes of small blocks come several to a
    call; a large block is received straight into its own buffer after what was read
    ahead of it. A view :meth:`take` returns is valid until the next call.

    Args:
        sock: the connection.
        deadline: monotonic seconds by which every receive must be done (None: the
            socket's own timeout); :attr:`deadline` may be moved between frames.
        step: the longest one receive may wait, seconds (None: up to ``deadline``).
    """

    def __init__(
        self, sock: socket.socket, deadline: float | None = None, step: float | None = None
    ) -> None:
        self.sock = sock
        self.deadline = deadline
        self.step = step
        self.last = time.monotonic()  # when bytes last came (kept with a ``step``)
        self._buf = bytearray(READ_AHEAD)
        self._view = memoryview(self._buf)
        self._start = self._end = 0

    @property
    def empty(self) -> bool:
        """Whether nothing was read ahead (the connection may carry the next call)."""
        return self._start == self._end

    def _recv(self, view: memoryview) -> int:
        if self.deadline is not None:
            wait = self.deadline - time.monotonic()
            if self.step is not None:
                wait = min(wait, self.step)
            self.sock.settimeout(max(0.001, wait))
        n = self.sock.recv_into(view)
        if self.step is not None:
            self.last = time.monotonic()
        return n

    def take(self, size: int) -> memoryview:
        """The next ``size`` (≤ :data:`READ_AHEAD`) bytes.

        Raises:
            EOFError: the connection ended first.
            TimeoutError, OSError: as the socket.
        """
        if self._end - self._start < size:
            if self._start:  # what is left to the front: room to read ahead again
                left = self._end - self._start
                self._view[:left] = self._view[self._start : self._end]
                self._start, self._end = 0, left
            while self._end < size:
                n = self._recv(self._view[self._end :])
                if not n:
                    raise EOFError(f"connection closed after {self._end} of {size} bytes")
                self._end += n
        view = self._view[self._start : self._start + size]
        self._start += size
        return view

    def into(self, dest: memoryview) -> None:
        """Fills ``dest``: what was read ahead first, then straight from the socket.

        Raises:
            EOFError: the connection ended first.
            TimeoutError, OSError: as the socket.
        """
        have = min(len(dest), self._end - self._start)
        dest[:have] = self._view[self._start : self._start + have]
        self._start += have
        got, size = have, len(dest)
        while got < size:
            n = self._recv(dest[got:])
            if not n:
                raise EOFError(f"connection closed after {got} of {size} bytes")
            got += n
