"""The hub's bulk block channel (:mod:`protocol.bulk`) as a block source.

Block bytes come over plain TCP (TLS when the hub link is TLS) beside the gRPC channel,
which stays the control plane. A call's blocks are received by one of ``workers`` threads
(:class:`BulkSource`): it sends the request, ``recv_into``s each block into a page-aligned
buffer it re-uses (the one copy, by the kernel), verifies it (xxh3-128 releases the GIL)
and writes it to the block's temporary file (``stage``,
:meth:`spoke.cache.store.BlockStore.stage`; ``O_DIRECT`` for blocks nobody waits for yet,
:mod:`spoke.cache.staging`), then hands the event loop a
:class:`~spoke.cache.staging.Staged`: the loop only admits it (room, a rename, the index,
the policy). Receiving, verifying, writing and the socket waits run off the loop and
outside the GIL, so ``workers`` streams use as many cores.

Connections are kept between calls (one per worker at most, re-used by the next call on
any worker); a connection whose call failed or was cancelled is closed. The request
carries the spoke's current token (its file re-read when changed,
:meth:`~spoke.hublink.credentials.HubCredentials.metadata`); the hub checks it, its scope
and its limits as it checks ``ReadBlocks``, and its refusals become the same spoke errors
(:func:`~spoke.hublink.source.status_error`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import grpc

from protocol import bulk
from protocol.address import parse_hostport
from spoke import metrics
from spoke.cache.store import Received
from spoke.errors import CorruptBlock, HubUnavailable
from spoke.fetch.priority import Priority
from spoke.hublink.client import HubClient
from spoke.hublink.receive import END, Buffers, Frames, Handoff, Stage, peer_of, receive_block
from spoke.hublink.source import status_error

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10.0
"""Longest a connection (and its TLS handshake) may take, seconds."""

KEEP_S = 30.0
"""A connection idle this long is not re-used (the hub closes one idle for 60 s,
``hub.limits.sizes.IDLE_S``: a call must not find it closed under it and pay a retry)."""

_CODES = {code.value[0]: code for code in grpc.StatusCode}


class BulkSource:
    """The hub's bulk channel as a block source (see the module docstring).

    Args:
        hub: the hub's gRPC client: its addresses (each host with ``port``), credentials
            and name.
        port: the hub's bulk port (``strata-hub serve --bulk-port``).
        workers: threads receiving blocks; each runs one call at a time.
        stage: writes a verified block to its temporary file from the receiving thread
            (:meth:`spoke.cache.store.BlockStore.stage`): the thread then re-uses one
            page-aligned buffer and hands the loop a :class:`~spoke.cache.staging.Staged`.
            None: each block is copied out of that buffer and handed over in memory.
    """

    def __init__(self, hub: HubClient, port: int, workers: int, stage: Stage | None = None) -> None:
        if workers < 1:
            raise ValueError("--fetch-workers must be at least 1")
        if not 0 < port <= 65535:
            raise ValueError(f"--hub-bulk-port {port} is not a port (1 to 65535)")
        self.hub = hub
        self.port = port
        self.workers = workers
        hosts = [parse_hostport(t.strip())[0] for t in hub.target.split(",") if t.strip()]
        self._hosts = hosts
        self._next = 0
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="strata-bulk")
        self._idle: list[tuple[socket.socket, object, float]] = []  # socket, TLS, since
        self._idle_lock = threading.Lock()
        self._stage = stage
        self._buffers = Buffers()  # each receive thread's page-aligned buffer
        self.problem: str | None = None
        """Why the last call (or the start's probe) failed to reach the bulk channel; None
        once a call went through (``/readyz`` says it)."""

    verifies = True
    """Every block it yields was hashed against its digest (by its receive thread), so the
    fetcher does not hash it again (:class:`~spoke.fetch.fetcher.Fetcher`)."""

    @property
    def name(self) -> str:
        """The hub's ``HOST:PORT`` (its gRPC address: where it is configured)."""
        return self.hub.target

    def probe(self, timeout: float = 3.0) -> str | None:
        """Why the bulk port cannot be reached (a TCP connection to it), or None when it
        can; blocking (call it in a thread). Checked once at start, so a wrong
        ``--hub-bulk-port`` is said at once instead of as every fetch's failure."""
        try:
            socket.create_connection((self._hosts[0], self.port), timeout=timeout).close()
        except OSError as err:
            self.problem = f"{self.address}: {err.strerror or err}"
            return self.problem
        self.problem = None
        return None

    def close(self) -> None:
        """Closes the kept connections and stops the workers (after their calls)."""
        with self._idle_lock:
            idle, self._idle = self._idle, []
        for sock, _, _ in idle:
            sock.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def read_blocks(
        self, blocks: Sequence[tuple[str, int]], timeout: float, priority: Priority
    ) -> AsyncIterator[tuple[str, bytes]]:
        """As :meth:`~spoke.fetch.source.BlockSource.read_blocks`: in request order, each
        block already verified against its digest (a mismatch raises
        :class:`~spoke.errors.CorruptBlock` after the blocks before it).

        Raises:
            NotFound, InvalidRequest, AccessDenied, HubUnavailable: as the gRPC path.
            CorruptBlock: a block's bytes do not match its digest.
        """
        loop = asyncio.get_running_loop()
        call = Handoff(loop)
        self.hub.credentials.refresh_tls()
        material = self.hub.credentials.material
        token = _token(self.hub.credentials.metadata())
        deadline = time.monotonic() + timeout
        # the hub serves every class alike; a block nobody waits for yet bypasses the
        # page cache (spoke/cache/staging.py)
        direct = priority != Priority.DEMAND
        work = loop.run_in_executor(
            self._pool, self._receive, call, list(blocks), token, material, deadline, direct
        )
        try:
            while True:
                item = await call.get()
                if item is END:
                    break
                if isinstance(item, BaseException):
                    if isinstance(item, HubUnavailable):
                        self.problem = str(item)
                    raise item
                assert isinstance(item, tuple)
                digest: str = item[0]
                data: bytes = item[1]
                metrics.HUB_FETCH_BYTES.inc(len(data))
                metrics.HUB_BULK_BYTES.inc(len(data))
                metrics.HUB_FETCH_BLOCKS.inc()
                yield digest, data
            metrics.HUB_UP.set(1)
            self.problem = None
        finally:
            call.cancel()
            with contextlib.suppress(BaseException):
                await work
            call.discard()  # staged and never taken: not a block, not kept

    def _receive(
        self,
        call: Handoff,
        blocks: list[tuple[str, int]],
        token: str,
        material: object,
        deadline: float,
        direct: bool,
    ) -> None:
        """One call, in a worker thread: every block to ``call``, then the end; an error
        instead of the rest."""
        sock: socket.socket | None = None
        reusable = False
        try:
            sock = self._connection(material, deadline, call)
            with call.lock:
                if call.cancelled:
                    return
                call.sock = sock
            frames = Frames(sock, deadline)
            for start in range(0, len(blocks), bulk.MAX_DIGESTS):
                part = blocks[start : start + bulk.MAX_DIGESTS]
                sock.sendall(bulk.encode_request(token, [d for d, _ in part]))
                for digest, size in part:
                    call.put(self._block(frames, digest, size, direct))
            with call.lock:  # from here on, a cancel must not shut the kept socket down
                call.sock = None
                reusable = not call.cancelled and frames.empty
            call.put(END)
        except BaseException as err:  # every failure reaches the loop as the call's error
            call.put(self._error(err, call))
        finally:
            if sock is not None:
                if reusable:
                    with self._idle_lock:
                        self._idle.append((sock, material, time.monotonic()))
                else:
                    sock.close()

    def _block(self, frames: Frames, digest: str, size: int, direct: bool) -> tuple[str, Received]:
        """One block off the wire, verified; staged when the source stages."""
        code, got, length = bulk.parse_block_head(frames.take(bulk.BLOCK_HEAD.size))
        if code != bulk.OK:
            message = bytes(frames.take(length)).decode("utf-8", "replace")
            raise _Refused(code, message)
        if got != digest or length > size:
            raise HubUnavailable(
                f"hub {self.hub.target} bulk stream out of order: got {got} ({length} bytes), "
                f"expected {digest} (at most {size})"
            )
        return digest, receive_block(frames, self._buffers, digest, length, direct, self._stage)

    @property
    def address(self) -> str:
        """``HOST:PORT`` of the bulk port (the first hub address's host)."""
        return f"{self._hosts[0]}:{self.port}"

    def _connection(self, material: object, deadline: float, call: Handoff) -> socket.socket:
        with self._idle_lock:
            while self._idle:
                sock, kept, since = self._idle.pop()
                if kept == material and time.monotonic() - since < KEEP_S:
                    call.address = peer_of(sock)
                    return sock
                sock.close()  # made with credentials since replaced, or the hub's by now
        host = self._hosts[self._next % len(self._hosts)]
        self._next += 1
        call.address = f"{host}:{self.port}"
        timeout = max(0.001, min(CONNECT_TIMEOUT_S, deadline - time.monotonic()))
        sock = socket.create_connection((host, self.port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if material is None:
            return sock
        try:
            return self._tls_context().wrap_socket(
                sock, server_hostname=self.hub.credentials.server_name or host
            )
        except BaseException:
            sock.close()
            raise

    def _tls_context(self) -> ssl.SSLContext:
        credentials = self.hub.credentials
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        if credentials.ca is not None:
            context.load_verify_locations(cafile=str(credentials.ca))
        if credentials.cert is not None and credentials.key is not None:
            context.load_cert_chain(str(credentials.cert), str(credentials.key))
        context.set_alpn_protocols([bulk.ALPN])
        return context

    def _error(self, err: BaseException, call: Handoff) -> BaseException:
        """The spoke error for a failed call (counted like the gRPC path's)."""
        where = f"hub {self.hub.target} bulk channel {call.address or self.address}"
        if isinstance(err, _Refused):
            code = _CODES.get(err.code, grpc.StatusCode.UNKNOWN)
            metrics.HUB_FETCH_ERRORS.labels(code.name).inc()
            refused = None
            if code == grpc.StatusCode.UNAUTHENTICATED:  # as the gRPC path says it
                refused = (
                    f"hub {self.hub.target} refused the token: {err.message} "
                    "(check --hub-token-file)"
                )
            return status_error(code, err.message, self.hub.target, refused)
        if isinstance(err, CorruptBlock | HubUnavailable):
            metrics.HUB_FETCH_ERRORS.labels("OUT_OF_ORDER").inc()
            return err
        if call.cancelled:
            return HubUnavailable("cancelled")
        if isinstance(
            err, TimeoutError | OSError | ssl.SSLError | EOFError | bulk.BulkProtocolError
        ):
            metrics.HUB_FETCH_ERRORS.labels("UNAVAILABLE").inc()
            metrics.HUB_UP.set(0)
            return HubUnavailable(f"{where}: {err}")
        return HubUnavailable(f"{where} failed: {err!r}")


class _Refused(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _token(metadata: tuple[tuple[str, str], ...]) -> str:
    """The bearer token of the gRPC call metadata ('' without one)."""
    for key, value in metadata:
        if key == "authorization":
            return value.partition(" ")[2].strip()
    return ""
