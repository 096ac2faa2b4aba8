"""Peer reads over the owners' bulk ports (``--peer-bulk-port``): what
:meth:`~spoke.mesh.peerclient.PeerClient.read_blocks` does over gRPC, with the hub bulk
channel's receive machinery (:mod:`spoke.hublink.receive`).

A call carries what the gRPC call carries (:mod:`protocol.bulk`, its peer variant): the
region's token, this spoke's read grant and a fresh proof of possession made for the
owner's mesh name and ``ReadBlocks``, the class, each block's size from this spoke's
manifests and the snapshots they come from. It runs in one of :data:`WORKERS` receive
threads: each block is ``recv_into`` a page-aligned buffer the thread re-uses, verified
against its digest there and staged to its temporary file
(:meth:`spoke.cache.store.BlockStore.stage`), so the event loop only admits it.

An owner is held to what the gRPC path holds it to, with the same ``kind`` of
:class:`~spoke.mesh.peerclient.PeerError`: a block of another size than this spoke's is
``lying`` before a byte of it is read; one out of order is ``protocol``; block *k* must
have arrived ``step_timeout`` plus the bytes of blocks 0..*k* at ``min_rate`` after the
call started (``slow``), no receive may wait ``step_timeout`` (``timeout``), and the call
ends at its budget (``deadline``). A block whose bytes fail verification is ``corrupt``.
An error frame is the gRPC status's kind (``refused`` for UNAUTHENTICATED, …), and a
connection that cannot be made or breaks is ``unavailable``. Every one of them sends the
call's undelivered blocks to the hub (:class:`~spoke.mesh.source.MeshSource`).

Every spoke of a region serves its bulk peer port on the same port number, on the host of
its mesh name. Connections are kept between calls (:data:`KEEP_S`), one per call in flight;
a kept one the owner closed meanwhile (it restarted) is dialled again once before the
call fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc

from protocol import bulk
from protocol.address import parse_hostport
from protocol.grants import GRANT_METADATA, PROOF_METADATA
from spoke.cache.store import Received
from spoke.errors import CorruptBlock
from spoke.fetch.priority import Priority
from spoke.hublink.receive import END, Buffers, Frames, Handoff, Stage, receive_block
from spoke.mesh.grants import GrantKeeper
from spoke.mesh.peerclient import MIN_RATE_BPS, PeerError, kind_of
from spoke.mesh.transport import PeerTls, PeerToken

WORKERS = 16
"""Receive threads: a spoke's scheduler has at most 16 streams in flight, over all owners."""

KEEP_S = 30.0
"""A connection idle this long is not re-used (the owner closes one idle for 60 s)."""

_CODES = {code.value[0]: code for code in grpc.StatusCode}


class _Declined:
    """The owner's declined digests, handed to the loop before any block."""

    def __init__(self, digests: list[str]) -> None:
        self.digests = digests


@dataclass
class _Pace:
    """When the block awaited is due (as :class:`~spoke.mesh.peerclient.Pace`)."""

    start: float
    end: float
    step: float
    min_rate: float
    nbytes: int = 0

    @property
    def due(self) -> float:
        return self.start + self.step + self.nbytes / self.min_rate


class PeerBulkClient:
    """Reads from owners' bulk peer ports (see the module docstring).

    Args:
        port: the bulk peer port, the same on every spoke of the region.
        token: the region's token, or None (only with ``--peer-insecure``).
        tls: the peer TLS files, or None for plaintext (only with ``--peer-insecure``).
        grants: this spoke's read grant (None: calls carry none and are refused).
        stage: writes a verified block to its temporary file from the receiving thread;
            None: blocks are handed over as bytes.
        workers: receive threads.
    """

    def __init__(
        self,
        port: int,
        token: PeerToken | None = None,
        tls: PeerTls | None = None,
        grants: GrantKeeper | None = None,
        stage: Stage | None = None,
        workers: int = WORKERS,
    ) -> None:
        if not 0 < port <= 65535:
            raise ValueError(f"--peer-bulk-port {port} is not a port (1 to 65535)")
        self.port, self.token, self.tls, self.grants = port, token, tls, grants
        self.stage = stage
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="strata-peer-bulk")
        self._buffers = Buffers()
        self._idle: dict[str, list[tuple[socket.socket, int, float]]] = {}
        self._idle_lock = threading.Lock()
        self._context: tuple[int, ssl.SSLContext] | None = None

    verifies = True
    """Every block yielded was hashed against its digest by its receive thread."""

    def close(self) -> None:
        """Closes the kept connections and stops the threads (after their calls)."""
        with self._idle_lock:
            idle, self._idle = self._idle, {}
        for kept in idle.values():
            for sock, _, _ in kept:
                sock.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def read_blocks(
        self,
        node: str,
        blocks: Sequence[tuple[str, int]],
        request_class: str,
        timeout: float,
        step_timeout: float,
        snapshots: Sequence[tuple[str, str, str]] = (),
        on_declined: Callable[[list[str]], None] = lambda digests: None,
        min_rate: float = MIN_RATE_BPS,
    ) -> AsyncIterator[tuple[str, Received]]:
        """As :meth:`~spoke.mesh.peerclient.PeerClient.read_blocks` from ``node``'s bulk
        port, but each block verified (and staged when the client stages).

        Raises:
            PeerError: as the gRPC path's, and ``corrupt`` for a block that fails
                verification (the blocks before it were yielded).
        """
        metadata = dict(self.grants.metadata(node, "ReadBlocks")) if self.grants else {}
        try:
            request = bulk.encode_peer_request(
                bulk.PeerRequest(
                    self.token.current() if self.token is not None else "",
                    metadata.get(GRANT_METADATA, b""),
                    metadata.get(PROOF_METADATA, b""),
                    request_class,
                    tuple(blocks),
                    tuple(snapshots),
                )
            )
        except bulk.BulkProtocolError as err:
            raise PeerError("invalid_argument", f"peer {node}: {err}") from None
        loop = asyncio.get_running_loop()
        call = Handoff(loop)
        now = time.monotonic()
        pace = _Pace(now, now + timeout, step_timeout, min_rate)
        context = self._tls_context()
        direct = request_class != Priority.DEMAND.label
        work = loop.run_in_executor(
            self._pool, self._receive, call, node, request, list(blocks), pace, context, direct
        )
        try:
            while True:
                item = await call.get()
                if item is END:
                    break
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, _Declined):
                    on_declined(item.digests)
                    continue
                assert isinstance(item, tuple)
                yield item[0], item[1]
        finally:
            call.cancel()
            with contextlib.suppress(BaseException):
                await work
            call.discard()

    def _tls_context(self) -> tuple[int, ssl.SSLContext] | None:
        """The client TLS context of the peer files now (rebuilt once they changed)."""
        if self.tls is None:
            return None
        generation = self.tls.client_generation()
        if self._context is None or self._context[0] != generation:
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
            if self.tls.files.ca is not None:
                context.load_verify_locations(cadata=self.tls.files.ca.decode("ascii"))
            context.load_cert_chain(str(self.tls.cert), str(self.tls.key))
            context.set_alpn_protocols([bulk.ALPN])
            self._context = (generation, context)
        return self._context

    def _receive(
        self,
        call: Handoff,
        node: str,
        request: bytes,
        blocks: list[tuple[str, int]],
        pace: _Pace,
        context: tuple[int, ssl.SSLContext] | None,
        direct: bool,
    ) -> None:
        """One call, in a receive thread: the declined digests, each block, then the end
        to ``call``; a :class:`PeerError` instead of the rest."""
        sock: socket.socket | None = None
        frames: Frames | None = None
        reusable = False
        try:
            for fresh in (False, True):
                sock, reused = self._connection(node, pace, context, fresh)
                with call.lock:
                    if call.cancelled:
                        return
                    call.sock = sock
                frames = Frames(sock, min(pace.due, pace.end), pace.step)
                frames.last = pace.start
                try:
                    sock.settimeout(max(0.001, min(pace.step, pace.end - time.monotonic())))
                    sock.sendall(request)
                    head = frames.take(bulk.BLOCK_HEAD.size)
                    break
                except (EOFError, ConnectionError):
                    if not reused:
                        raise
                    sock.close()  # the owner closed it meanwhile (a restart): dial again
            assert frames is not None  # the loop breaks with one, or raises
            sizes = dict(blocks)
            code, _, count = bulk.parse_peer_reply_head(head)
            if code != bulk.DECLINED:
                raise self._refused(node, frames, code, count, "its declined frame")
            raw = bytes(frames.take(16 * count))
            declined = [d for d in bulk.split_digests(raw) if d in sizes]
            if declined:
                call.put(_Declined(declined))
            skip = set(declined)
            for digest, size in blocks:
                if digest not in skip:
                    call.put((digest, self._block(frames, node, digest, size, pace, direct)))
            with call.lock:  # from here on, a cancel must not shut the kept socket down
                call.sock = None
                reusable = not call.cancelled and frames.empty
            call.put(END)
        except BaseException as err:  # every failure reaches the loop as the call's error
            call.put(_error(err, node, self.port, pace, frames))
        finally:
            if sock is not None:
                if reusable:
                    with self._idle_lock:
                        kept = (sock, context[0] if context else 0, time.monotonic())
                        self._idle.setdefault(node, []).append(kept)
                else:
                    sock.close()

    def _block(
        self, frames: Frames, node: str, digest: str, size: int, pace: _Pace, direct: bool
    ) -> Received:
        """One block off the wire, held to its size and pace, verified (and staged)."""
        pace.nbytes += size
        frames.deadline = min(pace.due, pace.end)
        code, got, length = bulk.parse_peer_reply_head(frames.take(bulk.BLOCK_HEAD.size))
        if code != bulk.OK:
            raise self._refused(node, frames, code, length, f"block {digest}")
        if got != digest:
            raise PeerError("protocol", f"peer {node} out of order: got {got}, expected {digest}")
        if length != size:
            raise PeerError(
                "lying", f"peer {node} sent block {digest} as {length} bytes; it has {size}"
            )
        try:
            return receive_block(frames, self._buffers, digest, length, direct, self.stage)
        except CorruptBlock:
            raise PeerError(
                "corrupt", f"peer {node} served block {digest} with the wrong bytes"
            ) from None

    def _refused(self, node: str, frames: Frames, code: int, length: int, what: str) -> PeerError:
        """The error for a frame that is not what was due: an error frame's status, or a
        frame out of place (``protocol``)."""
        if code in (bulk.OK, bulk.DECLINED):
            return PeerError("protocol", f"peer {node} sent frame {code} in place of {what}")
        message = bytes(frames.take(length)).decode("utf-8", "replace")
        status = _CODES.get(code, grpc.StatusCode.UNKNOWN)
        return PeerError(kind_of(status), f"peer {node}: {message}")

    def _connection(
        self, node: str, pace: _Pace, context: tuple[int, ssl.SSLContext] | None, fresh: bool
    ) -> tuple[socket.socket, bool]:
        """A connection to ``node``'s bulk port: a kept one (True) unless ``fresh``, else
        a new one (False)."""
        generation = context[0] if context else 0
        with self._idle_lock:
            kept = [] if fresh else self._idle.get(node, [])
            while kept:
                sock, made, since = kept.pop()
                if made == generation and time.monotonic() - since < KEEP_S:
                    return sock, True
                sock.close()  # made with certificates since replaced, or the owner's by now
        host = parse_hostport(node)[0]
        wait = max(0.001, min(pace.step, pace.end - time.monotonic()))
        sock = socket.create_connection((host, self.port), timeout=wait)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if context is None:
            return sock, False
        try:
            name = self.tls.server_name if self.tls is not None else None
            return context[1].wrap_socket(sock, server_hostname=name or host), False
        except BaseException:
            sock.close()
            raise


def _error(
    err: BaseException, node: str, port: int, pace: _Pace, frames: Frames | None
) -> BaseException:
    """The :class:`PeerError` for a failed call (a cancelled one's error is not read)."""
    if isinstance(err, PeerError):
        return err
    where = f"peer {node} bulk port {port}"
    if isinstance(err, TimeoutError):
        silent_until = (frames.last if frames is not None else pace.start) + pace.step
        if pace.end <= min(pace.due, silent_until):
            return PeerError("deadline", f"{where}: the read's time ran out")
        if pace.due < silent_until:
            return PeerError("slow", f"{where} kept under {pace.min_rate:,.0f} bytes/s")
        return PeerError("timeout", f"{where} sent nothing for {pace.step:g} s")
    if isinstance(err, bulk.BulkProtocolError):
        return PeerError("protocol", f"{where}: {err}")
    if isinstance(err, OSError | EOFError | ssl.SSLError):
        return PeerError("unavailable", f"{where}: {err}")
    return PeerError("unavailable", f"{where} failed: {err!r}")
