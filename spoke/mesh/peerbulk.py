"""The bulk peer port (``--peer-bulk-port``): the region's peers' block reads over the bulk
channel (:mod:`protocol.bulk`, its peer variant) instead of the peer port's gRPC.

A request is admitted by the gRPC peer port's own code (:class:`~spoke.mesh.peercall.PeerGate`),
in its order and with its status codes, counts, audit records and log lines: the region's
token, the read grant and its proof of possession (made for this spoke's mesh name and
``ReadBlocks``, as over gRPC; the replay cache is the same one), the caller's calls and
memory, the request's shape, the grant's dataset scope over the blocks (the others are
declined, in the reply's first frame), the caller's bytes in flight. A refusal is an
error frame with the gRPC status, and the connection is closed. The blocks allowed come
from :class:`~spoke.mesh.peercall.PeerBlocks`: from the cache or through this spoke's
scheduler in the peer class (single flight: the region fetches a block from the hub once),
each checked against its digest before a byte of it is sent.

Bytes: a block file stored as it is (no encryption at rest) goes by ``sendfile(2)`` on a
plaintext port (``--peer-insecure``): this spoke never reads it into Python after the
check. Under TLS (the peer port's certificate and key, client certificates required with
``--peer-ca``: mTLS; files re-read when they change, for new connections), a sealed block
file, or a block the cache could not take, the bytes are written once per chunk of
:data:`~spoke.mesh.peercall.SERVE_CHUNK_BYTES` (the copy TLS makes anyway).

What a caller can make it hold before it has proven anything: one of ``max_connections``
connection slots, shared by address and displaced by newcomers as the gRPC peer port's door
shares them (:mod:`strata_local.doorslots`; a connection that showed the token is kept, and
a newcomer when every slot is kept is answered RESOURCE_EXHAUSTED and closed; under TLS
it is closed before any handshake). Until its first bytes are whole — a ClientHello's
record under TLS, a request's head without — a connection is a slot and a socket; then
its TLS handshake, at most :data:`strata_local.streamdoor.HANDSHAKES` pending at once
(:mod:`strata_local.streamdoor`), within :data:`~spoke.mesh.transport.HANDSHAKE_TIMEOUT_S`;
then a request of at most :data:`protocol.bulk.MAX_PEER_REQUEST_BYTES` within
:data:`~spoke.mesh.peercall.REQUEST_WAIT_S` of its first byte, and a connection with no
request for :data:`~spoke.mesh.transport.IDLE_S` is closed. A caller that stops reading
for :data:`SEND_WAIT_S` is cut off; an admitted call is charged in the peer port's
memory budget as a gRPC call is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl

import grpc

from protocol import bulk
from protocol.grants import GRANT_METADATA, PROOF_METADATA
from spoke.mesh import metrics
from spoke.mesh.blockfile import BlockFile
from spoke.mesh.peercall import (
    READ,
    REGION,
    REQUEST_WAIT_S,
    Caller,
    PeerBlocks,
    PeerGate,
    PeerRefused,
    snapshot_refs,
)
from spoke.mesh.transport import HANDSHAKE_TIMEOUT_S, IDLE_S, MAX_CONNECTIONS, PeerTls
from strata_local.doorslots import DoorSlot
from strata_local.streamdoor import TLS_STEP_BYTES, StreamDoor, write_steps

log = logging.getLogger(__name__)

SEND_WAIT_S = 60.0
"""Longest one block may take to leave, seconds (a caller that stops reading is cut off)."""

READ_LIMIT = 64 << 10
"""Unread input buffered per connection, bytes."""


class ServerTls:
    """The bulk peer port's TLS context from the peer port's files: TLS 1.2 or later,
    client certificates required with a CA (mTLS), ALPN :data:`protocol.bulk.ALPN`; a new
    context for the handshakes after the files changed (:meth:`PeerTls.client_generation`).

    Raises:
        ssl.SSLError, OSError: the files do not load.
    """

    def __init__(self, tls: PeerTls) -> None:
        self.tls = tls
        self.generation = tls.generation
        self.context = self._build()
        self.context.sni_callback = self._handshake

    def _build(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(str(self.tls.cert), str(self.tls.key))
        if self.tls.ca is not None:
            context.load_verify_locations(str(self.tls.ca))
            context.verify_mode = ssl.CERT_REQUIRED
        context.set_alpn_protocols([bulk.ALPN])
        return context

    def _handshake(self, sock: ssl.SSLObject, name: str | None, context: ssl.SSLContext) -> None:
        """At each handshake: the files' current context (rebuilt once they changed)."""
        if self.tls.client_generation() != self.generation:
            try:
                fresh = self._build()
            except (OSError, ssl.SSLError) as err:
                log.warning("bulk peer port keeps its certificates: %s", err)
            else:
                self.generation = self.tls.generation
                fresh.sni_callback = self._handshake
                self.context = fresh
        if sock.context is not self.context:
            sock.context = self.context


CLOSE_WAIT_S = 1.0
"""Longest a closing connection is waited for before it is dropped."""


async def _closed(writer: asyncio.StreamWriter) -> None:
    """Close a connection, waiting at most :data:`CLOSE_WAIT_S` for it: under TLS a peer
    that keeps its end open between calls may never answer ``close_notify``, and asyncio
    would wait 30 s for it (``ssl_shutdown_timeout``), holding up the daemon's stop."""
    writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), CLOSE_WAIT_S)
    except (Exception, asyncio.CancelledError):
        writer.transport.abort()


class PeerBulkServer:
    """Serves peers' block reads on the bulk channel (see the module docstring).

    Args:
        gate: the peer port's admission (its token, grant check, limits, refusals).
        blocks: where the blocks come from (the peer port's).
        tls: the peer port's TLS files; None for plaintext (``--peer-insecure``).
        max_connections: most connections open at once.
    """

    def __init__(
        self,
        gate: PeerGate,
        blocks: PeerBlocks,
        tls: PeerTls | None = None,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.gate, self.blocks = gate, blocks
        self._tls = ServerTls(tls) if tls is not None else None
        self._mtls = tls is not None and tls.ca is not None
        self._door = StreamDoor(
            max_connections,
            HANDSHAKE_TIMEOUT_S,
            self._connection,
            bulk.PEER_HEAD.size,
            tls=self._tls.context if self._tls is not None else None,
            read_limit=READ_LIMIT,
            refusal=self._refusal,
        )
        self.slots = self._door.slots
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        """Listens on ``host:port`` (port 0: a free one); returns the bound port.

        Raises:
            OSError: the address cannot be bound.
        """
        self.port = await self._door.start(host, port)
        return self.port

    async def close(self) -> None:
        """Stops accepting and ends the connections open (their callers go to the hub)."""
        await self._door.close()

    def _refusal(self, who: str) -> bytes:
        """The frame a plaintext newcomer gets when every slot is held by a caller that
        showed the token."""
        message = (
            f"{self.slots.open} bulk peer connections are open, the most this port "
            f"takes (--peer-max-connections {self.slots.max_connections})"
        )
        return bulk.encode_error(grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], message)

    async def _connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, slot: DoorSlot
    ) -> None:
        try:
            while await self._serve_one(reader, writer, slot):
                pass
        except (OSError, asyncio.IncompleteReadError):  # ssl.SSLError, TimeoutError too
            pass  # the caller went away or stopped reading: nothing to answer
        finally:
            await _closed(writer)

    async def _serve_one(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, slot: DoorSlot
    ) -> bool:
        """Answers one request; False when the connection is done (closed, idle, refused)."""
        who = slot.who
        try:
            head = await asyncio.wait_for(reader.readexactly(bulk.PEER_HEAD.size), IDLE_S)
        except (TimeoutError, asyncio.IncompleteReadError):
            return False  # idle, or closed between requests: the normal end
        self.slots.used(slot, asyncio.get_running_loop().time())  # given way to last
        try:
            try:
                request = await asyncio.wait_for(self._rest(reader, head), REQUEST_WAIT_S)
            except TimeoutError:
                self.gate.refuse(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    "no_request",
                    f"no whole request within {REQUEST_WAIT_S:g} s of its first byte",
                    who,
                )
            except bulk.BulkProtocolError as err:
                self.gate.refuse(grpc.StatusCode.INVALID_ARGUMENT, "malformed", str(err), who)
            await self._answer(writer, request, slot)
        except PeerRefused as refused:
            await _error(writer, refused)
            return False
        except (OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            raise  # the caller went away, stopped reading, or the port is closing
        except Exception as err:  # never a silent hang: INTERNAL, logged (gRPC: UNKNOWN)
            log.exception("bulk peer call from %s failed", who)
            await _error(writer, PeerRefused(grpc.StatusCode.INTERNAL, f"owner failed: {err!r}"))
            return False
        return True

    async def _rest(self, reader: asyncio.StreamReader, head: bytes) -> bulk.PeerRequest:
        length = bulk.parse_peer_head(head)
        return bulk.parse_peer_request(await reader.readexactly(length))

    async def _answer(
        self, writer: asyncio.StreamWriter, request: bulk.PeerRequest, slot: DoorSlot
    ) -> None:
        """Admits ``request`` as the gRPC peer port would, then sends the declined frame
        and each allowed block in order.

        Raises:
            PeerRefused: a check refused it, or a block could not be had (those before
                it were sent).
        """
        gate, who = self.gate, slot.who
        gate.authorize([f"Bearer {request.token}"] if request.token else [], who)
        if gate.token is not None or self._mtls:  # it showed a credential: slot kept
            self.slots.prove(slot, REGION)
        metadata = [(GRANT_METADATA, request.grant)] if request.grant else []
        metadata += [(PROOF_METADATA, request.proof)] if request.proof else []
        call = gate.verify(metadata, who)
        with gate.pending(call):
            digests = [d for d, _ in request.blocks]
            decision, priority = await gate.decide(
                call, digests, request.request_class, snapshot_refs(request.snapshots)
            )
            with gate.carry(call, decision):
                writer.write(bulk.encode_declined(decision.declined))
                async for digest, block in self.blocks.serve(decision.allowed, priority):
                    await asyncio.wait_for(self._send(writer, call, digest, block), SEND_WAIT_S)

    async def _send(
        self, writer: asyncio.StreamWriter, call: Caller, digest: str, block: BlockFile | bytes
    ) -> None:
        """One block's frame: from memory (charged while it is sent), by ``sendfile`` from
        a plain block file on a plaintext port, else a chunk at a time.

        Raises:
            PeerRefused: RESOURCE_EXHAUSTED, no memory for a block sent from memory.
            ConnectionError: the caller went away, or the file failed after its check
                (dropped from the cache; its head is sent, so the connection ends).
        """
        if isinstance(block, bytes):
            with self.gate.in_memory(call, len(block)):
                writer.write(bulk.encode_block_head(digest, len(block)))
                await write_steps(
                    writer, block, len(block) if self._tls is None else TLS_STEP_BYTES
                )
            metrics.PEER_BULK_BYTES.labels("written").inc(len(block))
            return
        with block:
            writer.write(bulk.encode_block_head(digest, block.size))
            plain = os.fstat(block.fd).st_size == block.size and block.size > block.chunk
            if plain and self._tls is None:
                with open(block.fd, "rb", buffering=0, closefd=False) as file:
                    loop = asyncio.get_running_loop()
                    sent = await loop.sendfile(writer.transport, file, 0, block.size)
                if sent != block.size:
                    raise ConnectionResetError(f"sent {sent} of block {digest}'s bytes")
                metrics.PEER_BULK_BYTES.labels("sendfile").inc(block.size)
                return
            step = block.chunk if self._tls is None else TLS_STEP_BYTES
            for offset in block.offsets():
                try:
                    data = await asyncio.to_thread(block.read, offset)
                except (OSError, ValueError) as err:  # CorruptBlock is a ValueError
                    # its head is sent: no error frame can follow, the connection ends
                    self.blocks.failed(block, err)
                    raise ConnectionAbortedError(str(err)) from err
                await write_steps(writer, data, step)  # under TLS, what is unread counts
                del data
            metrics.PEER_BULK_BYTES.labels("written").inc(block.size)


async def _error(writer: asyncio.StreamWriter, refused: PeerRefused) -> None:
    """Sends a refusal's error frame (the caller reads it, then the connection closes)."""
    with contextlib.suppress(ConnectionError, RuntimeError, TimeoutError):
        writer.write(bulk.encode_error(refused.code.value[0], refused.message))
        await asyncio.wait_for(writer.drain(), 5.0)


__all__ = ["READ", "PeerBulkServer", "ServerTls"]
