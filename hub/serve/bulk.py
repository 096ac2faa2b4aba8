"""The bulk block channel's server (:mod:`protocol.bulk`): block bytes without gRPC.

It runs on the hub's event loop beside the gRPC server and makes every check
``Hub.ReadBlocks`` makes, with the same code: the bearer token
(:meth:`hub.auth.tokens.TokenFile.authenticate`), the token's dataset scope (a block is found
only in a live version of a dataset the token may read, :meth:`hub.catalog.Catalog.block_size`),
the token's and the hub's stream slots and read budget (:mod:`hub.limits.budget`), TLS and mutual
TLS (the gRPC port's certificate, key and client CA), and one place that turns an error
into a status, counts it and audits a refusal (:meth:`hub.serve.service.HubService.failed`, as
``ReadBlocks``).

What a caller can make it hold before it has proven anything: one of ``max_connections``
connection slots, shared by address among the connections that have not yet carried an
accepted token (:mod:`strata_local.doorslots`: at the cap a newcomer displaces the oldest
of the address holding most of those; a connection that carried one is kept, and a
newcomer when every slot is kept is answered RESOURCE_EXHAUSTED and closed, under TLS
before any handshake). Until its first bytes are whole — a ClientHello's record under TLS,
a request's head without — a connection is a slot and a socket, nothing more; then TLS
begins, at most :data:`strata_local.streamdoor.HANDSHAKES` handshakes pending at once
(:mod:`strata_local.streamdoor`: asyncio's TLS layer holds about 310 KiB from the moment a
handshake begins, and the sixteenth probe took a replica to 900 MiB of its 1 GiB limit
with connections that sent part of a ClientHello), each within the gRPC port's handshake
timeout; then at most :data:`READ_LIMIT` bytes of unread input buffered, a request within
:data:`hub.serve.inbound.REQUEST_WAIT_S` of its first byte, and no request for
:data:`hub.limits.sizes.IDLE_S` closes it.

Bytes: from a local blob store without TLS, a block leaves by ``sendfile(2)`` (the loop's
:meth:`asyncio.AbstractEventLoop.sendfile`): the hub never reads it into Python, and the
kernel's readahead for the next blocks of the request is asked for
(``POSIX_FADV_WILLNEED``) while one is sent. Under TLS, or from S3, the block is read
whole in a worker thread and written in steps (the copy TLS needs anyway; under TLS steps
of :data:`~strata_local.streamdoor.TLS_STEP_BYTES`, :func:`~strata_local.streamdoor.write_steps`,
so what a client leaves unread is counted and charged until it leaves).

Stalls: a block leaves in steps of :data:`STEP_BYTES`, and while a step is under way the
client must take some of the connection's bytes (its kernel acknowledges them,
``TCP_INFO``) within every stall timeout (:attr:`hub.limits.budget.ReadBudget.stall_s`,
``--stall-timeout``). A connection that takes none is counted (``limit="stall"``), audited
and closed at once (an error frame could not reach a client that does not read), so the
block's charge is released and the kernel frees what the socket held. A reader that keeps
taking bytes, however slowly, is never cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import grpc

from hub.auth.tokens import ANONYMOUS, AUTHORIZATION, Principal, TokenFile, TokenTable
from hub.catalog import Catalog
from hub.errors import (
    BlockNotFound,
    CorruptBlob,
    HubError,
    InvalidArgument,
    ListenError,
    QuotaExceeded,
)
from hub.limits.budget import STALL_FLOOR_S, ReadBudget, stall_error
from hub.limits.sizes import IDLE_S
from hub.serve.bulksocket import acked_bytes, will_need
from hub.serve.inbound import REQUEST_WAIT_S
from hub.serve.metrics import HubMetrics
from hub.serve.wire import CHUNK_BYTES
from hub.store.blobstore import BlobStore, LocalBlobStore
from protocol import bulk
from strata_local.doorslots import DoorSlot
from strata_local.knownhosts import KnownHosts
from strata_local.streamdoor import TLS_STEP_BYTES, StreamDoor, write_steps

log = logging.getLogger(__name__)

_T = TypeVar("_T")

METHOD = "ReadBlocks"
"""The method name bulk requests are counted and audited under (the gRPC call's)."""

MAX_CONNECTIONS = 1024
"""Default most bulk connections open at once (``--bulk-max-connections``); a spoke holds
one per fetch worker."""

READAHEAD_BYTES = 1 << 20
"""Blocks of at least this size have the next block's readahead asked for while they are
sent (for smaller ones the three system calls cost more than they save)."""

STEP_BYTES = CHUNK_BYTES
"""Bytes of a block sent per step, each within the stall timeout (a gRPC message's worth,
so both channels ask a reader for the same progress)."""

READ_LIMIT = 16 * 1024
"""Unread input buffered per connection, bytes (a request is at most 12.3 KiB)."""


class _Stalled(Exception):
    """The client took none of a block's bytes within the stall timeout."""

    def __init__(self, error: QuotaExceeded) -> None:
        super().__init__(str(error))
        self.error = error


Failed = Callable[[str, str, Exception], tuple[grpc.StatusCode, str]]
"""Turns an error into ``(status, message)``, counted and audited: ``(method, peer, error)``."""


CLOSE_WAIT_S = 1.0
"""Longest a closing connection is waited for before it is dropped, seconds."""


class BulkServer:
    """Serves blocks on the bulk channel (see the module docstring).

    Args:
        tokens: Accepted bearer tokens; None lets every caller in (a hub without tokens).
        catalog: Where block sizes and who may read them are looked up.
        store: Where the blocks are.
        budget: The gRPC server's read budget (streams and bytes per token and in all).
        metrics: ``blocks_served``, ``blocks_served_bytes``, ``bulk_bytes`` counted here,
            ``bulk_connections`` read from here.
        failed: The service's error-to-status function (counts and audits).
        count: Counts a call that ended well: ``(method, grpc.StatusCode.OK)``.
        tls: The TLS context (:func:`tls_context`); None for plaintext.
        max_connections: Most connections open at once.
        handshake_timeout_s: Longest a TLS handshake may take, seconds.
        known: Who proved a token from which address lately (the gRPC door's too:
            :mod:`strata_local.knownhosts`); None: nobody yet.
    """

    def __init__(
        self,
        tokens: TokenTable | TokenFile | None,
        catalog: Catalog,
        store: BlobStore,
        budget: ReadBudget,
        metrics: HubMetrics,
        failed: Failed,
        count: Callable[[str, grpc.StatusCode], None],
        tls: ssl.SSLContext | None = None,
        max_connections: int = MAX_CONNECTIONS,
        handshake_timeout_s: float = 10.0,
        known: KnownHosts | None = None,
    ) -> None:
        if max_connections < 1:
            raise ValueError("--bulk-max-connections must be at least 1")
        self._tokens, self._catalog, self._store = tokens, catalog, store
        self._budget, self._metrics = budget, metrics
        self._failed, self._count = failed, count
        self._tls = tls
        self._door = StreamDoor(
            max_connections,
            handshake_timeout_s,
            self._connection,
            bulk.REQUEST_HEAD.size,
            tls=tls,
            read_limit=READ_LIMIT,
            refusal=self._refusal,
            known=known,
        )
        self.slots = self._door.slots
        mtls = tls is not None and tls.verify_mode == ssl.CERT_REQUIRED
        self._credentials = tokens is not None or mtls  # what a connection may prove
        self._local = store if isinstance(store, LocalBlobStore) and tls is None else None
        self.port = 0
        metrics.bulk_connections.set_function(lambda: self._door.connections)
        metrics.handshakes_waiting.labels("bulk").set_function(lambda: self._door.turns.waiting)
        metrics.handshake_rate.labels("bulk").set_function(lambda: self._door.turns.rate)

    async def start(self, host: str, port: int) -> int:
        """Listens on ``host:port`` (port 0: a free one); returns the bound port.

        Raises:
            ListenError: the address cannot be bound.
        """
        try:
            self.port = await self._door.start(host, port)
        except OSError as exc:
            raise ListenError(
                f"cannot listen on {host}:{port} (--bulk-port): {exc.strerror or exc}"
            ) from exc
        return self.port

    async def close(self) -> None:
        """Stops accepting and ends the connections open (their requests in flight fail
        at the client, which retries elsewhere)."""
        await self._door.close()

    def _refusal(self, peer: str) -> bytes:
        """The frame a plaintext newcomer gets when every slot is held by a caller that
        carried an accepted token (counted and audited)."""
        error = QuotaExceeded(
            "connections",
            f"{self.slots.open} bulk connections are open, the most this hub "
            f"allows (--bulk-max-connections {self.slots.max_connections}); retry",
        )
        code, details = self._failed(METHOD, peer, error)
        return bulk.encode_error(code.value[0], details)

    async def _connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, slot: DoorSlot
    ) -> None:
        try:
            while await self._serve_one(reader, writer, slot):
                pass
        except (ConnectionError, TimeoutError, ssl.SSLError, asyncio.IncompleteReadError):
            pass  # the client went away: nothing to answer
        finally:
            writer.close()
            try:  # under TLS a spoke keeping its end open may never answer close_notify,
                # and asyncio would wait 30 s (ssl_shutdown_timeout) for it at every stop
                await asyncio.wait_for(writer.wait_closed(), CLOSE_WAIT_S)
            except (Exception, asyncio.CancelledError):
                writer.transport.abort()

    async def _serve_one(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, slot: DoorSlot
    ) -> bool:
        """Answers one request; False when the connection is done (closed, idle, refused)."""
        peer = slot.who
        try:
            head = await asyncio.wait_for(reader.readexactly(bulk.REQUEST_HEAD.size), IDLE_S)
        except (TimeoutError, asyncio.IncompleteReadError):
            return False  # idle, or closed between requests: the normal end
        self.slots.used(slot, asyncio.get_running_loop().time())  # given way to last
        try:
            request = await asyncio.wait_for(self._rest(reader, head), REQUEST_WAIT_S)
            principal = self._authenticate(request.token)
            if self._credentials:  # it carried an accepted token (or passed mTLS): kept
                self.slots.prove(slot, principal.name)
        except TimeoutError:
            error: HubError = QuotaExceeded(
                "request", f"no whole request within {REQUEST_WAIT_S:g} s of its first byte"
            )
            await self._refuse(writer, peer, error)
            return False
        except bulk.BulkProtocolError as err:
            await self._refuse(writer, peer, InvalidArgument(str(err)))
            return False
        except HubError as err:
            await self._refuse(writer, peer, err)
            return False
        try:
            with self._budget.stream(principal.name):
                await self._answer(writer, principal, request.digests)
        except _Stalled as stalled:
            self._failed(METHOD, peer, stalled.error)  # counted and audited
            writer.transport.abort()  # nothing reaches a client that does not read
            return False
        except HubError as err:
            await self._refuse(writer, peer, err)
            return False
        except (ConnectionError, asyncio.CancelledError):
            raise
        except Exception as err:  # never a silent hang: INTERNAL, logged by failed()
            await self._refuse(writer, peer, err)
            return False
        self._count(METHOD, grpc.StatusCode.OK)
        return True

    async def _rest(self, reader: asyncio.StreamReader, head: bytes) -> bulk.BulkRequest:
        token_len = bulk.parse_request_head(head)
        token = (await reader.readexactly(token_len)).decode("utf-8", "replace")
        count = bulk.parse_count(await reader.readexactly(bulk.COUNT.size))
        digests = bulk.split_digests(await reader.readexactly(16 * count))
        return bulk.BulkRequest(token, digests)

    def _authenticate(self, token: str) -> Principal:
        if self._tokens is None:
            return ANONYMOUS
        # the very check (and message) of a gRPC call with the same token
        metadata = ((AUTHORIZATION, f"Bearer {token}"),) if token else ()
        return self._tokens.authenticate(metadata)

    async def _refuse(self, writer: asyncio.StreamWriter, peer: str, error: Exception) -> None:
        code, details = self._failed(METHOD, peer, error)
        with contextlib.suppress(ConnectionError, RuntimeError):
            writer.write(bulk.encode_error(code.value[0], details))
            await asyncio.wait_for(writer.drain(), 5.0)

    async def _answer(
        self, writer: asyncio.StreamWriter, principal: Principal, digests: Sequence[str]
    ) -> None:
        """Sends each block of ``digests`` in order, each charged to the caller's share of
        the read budget while it is sent.

        Raises:
            BlockNotFound: a block of no dataset the caller may read (those before it
                were sent).
            QuotaExceeded: no room in the read budget within its wait.
            CorruptBlob: a stored block has the wrong length.
            _Stalled: the client took no step of a block within the stall timeout.
        """
        readable = None if principal.scopes == ("*",) else principal.may_read
        sizes = await asyncio.to_thread(self._sizes, digests, readable)
        who = principal.name
        for i, (digest, size) in enumerate(zip(digests, sizes, strict=False)):
            if size is None:
                raise BlockNotFound(f"unknown block {digest}")
            if not self._budget.try_take(who, size):  # no future while there is room
                await self._budget.take(who, size)
            try:
                writer.write(bulk.encode_block_head(digest, size))
                if self._local is not None:
                    await self._sendfile(writer, digest, size, digests[i + 1 : i + 2], who)
                else:
                    data = await asyncio.to_thread(self._store.read, digest)
                    if len(data) != size:
                        raise CorruptBlob(f"block {digest} has {len(data)} bytes, not {size}")
                    step = STEP_BYTES if self._tls is None else TLS_STEP_BYTES
                    watch = functools.partial(self._progress, transport=writer.transport, who=who)
                    await write_steps(writer, data, step, watch)  # a step at a time
                    del data
            finally:
                self._budget.release(who, size)
            self._metrics.blocks_served.inc()
            self._metrics.blocks_served_bytes.inc(size)
            self._metrics.bulk_bytes.inc(size)

    async def _progress(
        self, step: Awaitable[_T], transport: asyncio.WriteTransport, who: str
    ) -> _T:
        """``step`` (a send on ``transport`` for token ``who``), given as long as the client takes
        bytes: within every stall timeout the client must have taken some
        (:func:`~hub.serve.bulksocket.acked_bytes`), or the step is given up. Progress, not the
        step's time, so a slow reader behind a deep socket buffer is served; where the kernel does
        not count, the step itself must complete within the stall timeout. But while ``who`` holds
        more than its fair share of the read budget and a token holding less waits
        (:meth:`ReadBudget.outweighed`), a step gets :data:`~hub.limits.budget.STALL_FLOOR_S`: issue
        39's third probe held the whole budget with two tokens' 96 connections each taking 64 KiB
        every 5 s, refusing every other token's reads.

        Raises:
            _Stalled: the client took nothing within a stall timeout, or too little while a
                lighter token waited.
        """
        budget = self._budget
        stall_s = budget.stall_s
        floor = min(stall_s, STALL_FLOOR_S)
        loop = asyncio.get_running_loop()
        sending = asyncio.ensure_future(step)
        try:
            taken = acked_bytes(transport)
            started = checked = loop.time()
            while True:
                done, _ = await asyncio.wait((sending,), timeout=floor / 2)
                if done:
                    return sending.result()
                now = loop.time()
                if now - started >= floor and budget.outweighed(who):
                    raise _Stalled(
                        stall_error("a step of a block while lighter tokens waited", floor)
                    )
                if now - checked >= stall_s:
                    moved = acked_bytes(transport)
                    if moved is None or moved == taken:
                        raise _Stalled(stall_error("a step of a block", stall_s))
                    taken, checked = moved, now
        finally:
            if not sending.done():
                sending.cancel()
                with contextlib.suppress(BaseException):
                    await sending

    def _sizes(
        self, digests: Sequence[str], readable: Callable[[str], bool] | None
    ) -> list[int | None]:
        """Each block's size, up to the first the caller may not read (None, last)."""
        sizes: list[int | None] = []
        for digest in digests:
            size = self._catalog.block_size(digest, readable)
            sizes.append(size)
            if size is None:
                break
        return sizes

    async def _sendfile(
        self,
        writer: asyncio.StreamWriter,
        digest: str,
        size: int,
        following: Sequence[str],
        who: str,
    ) -> None:
        """Sends a local blob file's bytes by ``sendfile(2)``: at once from here while
        the socket takes them (a small block: no future, no wake-up), the rest by the
        loop's ``sendfile`` as the socket drains.

        Raises:
            CorruptBlob: the blob file is missing or has another size.
            ConnectionError: the client went away.
            _Stalled: the client took no step within the stall timeout.
        """
        assert self._local is not None
        try:
            fd = os.open(self._local.path(digest), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise CorruptBlob(f"block {digest} is in the catalog, not the blob store") from None
        try:
            if os.fstat(fd).st_size != size:
                raise CorruptBlob(f"block {digest}'s blob file is not {size} bytes")
            if size >= READAHEAD_BYTES:
                for name in following:  # the kernel reads it while this one is sent
                    will_need(self._local.path(name))
            transport = writer.transport
            sent = 0
            if transport.get_write_buffer_size() == 0:  # the head left: bytes go in order
                sock = transport.get_extra_info("socket")
                with contextlib.suppress(BlockingIOError, InterruptedError):
                    while sent < size:
                        step = os.sendfile(sock.fileno(), fd, sent, size - sent)
                        if not step:
                            break
                        sent += step
            if sent < size:
                with open(fd, "rb", buffering=0, closefd=False) as file:
                    loop = asyncio.get_running_loop()
                    while sent < size:  # a step at a time, each within the stall timeout
                        step = min(STEP_BYTES, size - sent)
                        moved = await self._progress(
                            loop.sendfile(transport, file, sent, step), transport, who
                        )
                        if not moved:
                            break
                        sent += moved
            if sent != size:
                raise ConnectionResetError(f"sent {sent} of block {digest}'s {size} bytes")
        finally:
            os.close(fd)
