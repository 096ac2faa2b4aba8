"""The server side of the peer port: serve this spoke's blocks to the other spokes.

The admission and the blocks are :mod:`spoke.mesh.peercall`'s (the bulk peer port,
:mod:`spoke.mesh.peerbulk`, uses the same). A call is admitted in this order, each
refusal counted, audited and logged (:class:`~spoke.mesh.admission.Refusals`): the
region's token (UNAUTHENTICATED); the
caller's read grant and its proof of possession (:mod:`spoke.mesh.grantcheck`;
UNAUTHENTICATED); the request's shape (INVALID_ARGUMENT); which blocks may be served to
that grant, with their sizes from this spoke's own manifests
(:class:`~spoke.mesh.admission.ScopeCheck`: the others are declined in the initial
metadata, and the caller gets them from the hub); the caller's calls and bytes in flight
(RESOURCE_EXHAUSTED, ``limit``); the peer port's memory for callers
(:class:`~spoke.mesh.admission.MemoryBudget`: RESOURCE_EXHAUSTED, ``memory``). Only then
is anything queued. Every per-caller allowance is the grant's subject's
(:func:`~spoke.mesh.grantcheck.caller_of`), however many grants it minted.

A block allowed is served from the cache, or fetched from the hub through this spoke's own
scheduler in its ``peer`` class (after local demand, through the link window: a peer never
takes the demand streams; one single-flight entry, so every spoke of the region asking at
once makes one hub fetch) and then kept here: the owner holds the region's copy. Serving a
block counts as a read in the owner's eviction policy, so blocks the region reads stay
cached at their owner — a placement hint, not a pin. Blocks read back from disk are
verified before they are sent; a bad one is dropped and fetched again.

A block is sent a chunk of :data:`SERVE_CHUNK_BYTES` at a time, each read from the block's
open file when the caller has taken the one before (:mod:`spoke.mesh.blockfile`), so a
caller that stops reading holds one chunk here (and gRPC's copies of it), which its call
is charged for (:data:`CALL_HOLD_BYTES`); a block the cache could not take is sent from
memory, charged its size while it is.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from typing import Any, NoReturn

import grpc
import grpc.aio

from protocol.address import parse_option_hostport
from protocol.grants import DECLINED_METADATA
from protocol.hub.v1 import hub_pb2
from protocol.spoke.v1 import peer_pb2, peer_pb2_grpc
from spoke.cache.blockcache import BlockCache
from spoke.fetch.scheduler import FetchScheduler
from spoke.mesh.admission import CallerLimits, Decision, MemoryBudget, Refusals, ScopeCheck
from spoke.mesh.blockfile import BlockFile
from spoke.mesh.grantcheck import GrantVerifier
from spoke.mesh.peercall import (
    CALL_HOLD_BYTES,
    PENDING_HOLD_BYTES,
    READ,
    REGION,
    REQUEST_WAIT_S,
    SERVE_CHUNK_BYTES,
    Caller,
    PeerBlocks,
    PeerGate,
    PeerRefused,
)
from spoke.mesh.peerclient import MAX_MESSAGE_BYTES
from spoke.mesh.probedoor import ProbeDoor
from spoke.mesh.relay import RELAY_METADATA
from spoke.mesh.source import MeshSource
from spoke.mesh.transport import (
    HANDSHAKE_TIMEOUT_S,
    MAX_CONNECTIONS,
    PeerTls,
    PeerToken,
    server_options,
)
from strata_local import grpclog
from strata_local.door import Door

__all__ = [
    "CALL_HOLD_BYTES",
    "PENDING_HOLD_BYTES",
    "PROBE_CALLS",
    "PROBE_CALLS_PER_HOST",
    "REQUEST_WAIT_S",
    "SERVE_CHUNK_BYTES",
    "PeerServer",
    "PeerService",
    "start_peer_server",
]

PROBE_CALLS = 1024
"""Most ``Probe`` calls open at once: an unread reply holds about 26 KiB of gRPC state, and
the port's connection and stream caps alone would let a region-token holder keep 131,072
open (3.4 GiB); a region's spokes probe each other every few seconds, a few at a time."""

REQUEST_BYTES = 64 << 10
"""The peer port's receive limit, bytes (``grpc.max_receive_message_length``): HTTP/2's
initial stream window. The largest request allowed (:data:`MAX_BLOCKS_PER_REQUEST` blocks
of 8 snapshots) is about 12 KB, and gRPC core opens a stream's window to the length a
message declares only within this limit (beyond it the call is refused as the length
arrives), so a request still arriving holds at most the one window every stream has."""

PROBE_CALLS_PER_HOST = PROBE_CALLS // 8
"""Most ``Probe`` calls open at once from one host (issue 39's sixth probe: one region-token
holder's window-0 calls held all :data:`PROBE_CALLS`, every honest probe was refused and
the region's spokes dropped this one from the mesh). A spoke probes each peer every few
seconds, one call at a time."""

_INVALID = grpc.StatusCode.INVALID_ARGUMENT


def _host_of(peer: str) -> str:
    """The host of a gRPC peer string (``ipv4:10.0.0.7:5000`` -> ``ipv4:10.0.0.7``)."""
    return peer.rpartition(":")[0] or peer


class PeerService(peer_pb2_grpc.SpokePeerServicer):
    """The ``SpokePeer`` gRPC service.

    Args:
        node: this spoke's name in the mesh (answered to probes).
        cache: the block cache.
        scheduler: fetches what is not cached (its source is ``source``).
        source: the mesh source, told which blocks peers asked for (those go to the hub).
        verifier: checks callers' grants and proofs.
        scope: decides which blocks a grant may be served.
        token: the region's token, or None to accept calls without one (``--peer-insecure``).
        limits: per-caller limits (defaults otherwise).
        refusals: where refusals are counted and audited (a fresh one without audit log).
        memory: the peer port's memory for callers (:data:`~spoke.mesh.admission.MEMORY_BUDGET`
            otherwise).
    """

    def __init__(
        self,
        node: str,
        cache: BlockCache,
        scheduler: FetchScheduler,
        source: MeshSource,
        verifier: GrantVerifier,
        scope: ScopeCheck,
        token: PeerToken | None = None,
        limits: CallerLimits | None = None,
        refusals: Refusals | None = None,
        memory: MemoryBudget | None = None,
    ) -> None:
        self.node = node
        self.cache = cache
        self.scheduler = scheduler
        self.source = source
        self.verifier = verifier
        self.scope = scope
        self.token = token
        self.limits = limits or CallerLimits()
        self.refusals = refusals or Refusals(None)
        self.memory = memory or MemoryBudget()
        self.gate = PeerGate(verifier, scope, token, self.limits, self.refusals, self.memory)
        self.blocks = PeerBlocks(cache, scheduler, source)
        self.door: Door | None = None  # set by start_peer_server
        self.probing = 0  # Probe calls not done yet (their replies may wait unread)
        self._probing_by: collections.Counter[str] = collections.Counter()  # by host

    async def _abort(
        self, context: grpc.aio.ServicerContext[Any, Any], refused: PeerRefused
    ) -> NoReturn:
        """End the call with a refusal's status (recorded by the gate already).

        A call refused before its request is read ends without reading it: gRPC core drops
        what arrives for it. Our clients send the request with the call's headers (a
        unary-stream call, :mod:`spoke.mesh.peerclient`), so they read this status.
        """
        await context.abort(refused.code, refused.message)
        raise AssertionError("context.abort() returned")  # it always raises

    def _who(self, context: grpc.aio.ServicerContext[Any, Any]) -> str:
        """The caller (through the door: the address it connected from)."""
        peer = context.peer()
        return peer if self.door is None else self.door.who(peer)

    def _authorized(
        self, context: grpc.aio.ServicerContext[Any, Any], who: str, what: str = READ
    ) -> None:
        """The region's token (:meth:`PeerGate.authorize`); once it is, the door keeps the
        call's connection (:meth:`~strata_local.door.Door.prove`)."""
        try:
            self.gate.authorize(self._authorization(context), who, what)
        except PeerRefused:
            if self.door is not None:  # a token since changed: displaceable again
                self.door.unprove(context.peer())
            raise
        if self.door is not None:
            self.door.prove(context.peer(), REGION)

    def _authorization(self, context: grpc.aio.ServicerContext[Any, Any]) -> list[str | bytes]:
        return [v for k, v in context.invocation_metadata() or () if k == "authorization"]

    async def admit_probe(
        self, context: grpc.aio.ServicerContext[peer_pb2.ProbeRequest, peer_pb2.ProbeResponse]
    ) -> None:
        """Admits a ``Probe`` call from its headers, before its request is read
        (:class:`~spoke.mesh.probedoor.ProbeDoor` calls it): the region's token, and at most
        :data:`PROBE_CALLS` calls at once, each counted from here until gRPC reports it done
        (its request may be arriving, its reply may wait unread). A refused call is counted
        and audited by the gate and ended at once; gRPC core drops what arrives for it."""
        who = self._who(context)
        host = _host_of(who)
        try:
            self._authorized(context, who, "peer Probe")
            mine = self._probing_by[host]
            if self.probing >= PROBE_CALLS or mine >= PROBE_CALLS_PER_HOST:
                self.gate.refuse(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    "limit",
                    f"{self.probing} Probe calls are open here ({mine} from {host}), the "
                    f"most this peer port takes ({PROBE_CALLS}, {PROBE_CALLS_PER_HOST} a host)",
                    who,
                    "peer Probe",
                )
        except PeerRefused as refused:
            await self._abort(context, refused)
        self.probing += 1
        self._probing_by[host] += 1
        context.add_done_callback(lambda _: self._probe_done(host))

    async def Probe(
        self,
        request: peer_pb2.ProbeRequest,
        context: grpc.aio.ServicerContext[peer_pb2.ProbeRequest, peer_pb2.ProbeResponse],
    ) -> peer_pb2.ProbeResponse:
        """Who this is and how many blocks it holds (admitted by :meth:`admit_probe` before
        its request was read)."""
        return peer_pb2.ProbeResponse(node=self.node, cached_blocks=len(self.cache))

    def _probe_done(self, host: str) -> None:
        self.probing -= 1
        self._probing_by[host] -= 1
        if self._probing_by[host] <= 0:
            del self._probing_by[host]

    async def ReadBlocks(
        self,
        request_iterator: AsyncIterator[peer_pb2.PeerReadRequest],
        context: grpc.aio.ServicerContext[peer_pb2.PeerReadRequest, hub_pb2.BlockChunk],
    ) -> AsyncIterator[hub_pb2.BlockChunk]:
        """Each requested block the caller may have, in order, in chunks of at most
        :data:`SERVE_CHUNK_BYTES`; the others are declined up front (the checks are
        :class:`~spoke.mesh.peercall.PeerGate`'s, the bulk peer port's too)."""
        gate, who = self.gate, self._who(context)
        try:
            # every refusal before the request is read ends the call without reading it
            self._authorized(context, who)
            call = gate.verify(context.invocation_metadata() or (), who)
            # the call's slot and memory are taken before its request is read: a caller
            # that opens calls and never sends a request holds them, within its allowance
            with gate.pending(call):
                request = await self._request(request_iterator, call)
                digests = [b.digest for b in request.blocks]
                decision, priority = await gate.decide(
                    call, digests, request.request_class, request.snapshots
                )
                gate.hint(call, decision, request)
                with gate.carry(call, decision):
                    said = _said(decision)
                    await context.send_initial_metadata(said)
                    if said and not decision.allowed:
                        # the call ends at once, and a unary-stream caller can then read
                        # empty initial metadata: the trailers say it again
                        context.set_trailing_metadata(said)
                    async for digest, block in self.blocks.serve(
                        decision.allowed, priority, request.relay
                    ):
                        if isinstance(block, bytes):
                            chunks = self._from_memory(block, digest, call)
                        else:
                            chunks = self._from_file(block)
                        async for chunk in chunks:
                            yield chunk
                async for _ in request_iterator:
                    gate.refuse(
                        _INVALID, "malformed", "one request per call", who, READ, call.subject
                    )
        except PeerRefused as refused:
            await self._abort(context, refused)

    async def _request(
        self, requests: AsyncIterator[peer_pb2.PeerReadRequest], call: Caller
    ) -> peer_pb2.PeerReadRequest:
        """The call's one request, within :data:`REQUEST_WAIT_S`; refuses a call that sends
        none in time (``no_request``) or ends without one (``malformed``)."""
        try:
            return await asyncio.wait_for(anext(requests), REQUEST_WAIT_S)
        except TimeoutError:
            self.gate.refuse(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                "no_request",
                f"no request within {REQUEST_WAIT_S:g} s of the call",
                call.who,
                READ,
                call.subject,
            )
        except StopAsyncIteration:
            self.gate.refuse(_INVALID, "malformed", "no request", call.who, READ, call.subject)

    async def _from_file(self, block: BlockFile) -> AsyncIterator[hub_pb2.BlockChunk]:
        """A checked block file's chunks, each read when the one before has been taken."""
        with block:
            for offset in block.offsets():
                try:  # the bytes read live on in the message only, while it is sent
                    message = _chunk(block, offset, await asyncio.to_thread(block.read, offset))
                except (OSError, ValueError) as err:  # CorruptBlock is a ValueError
                    raise self.blocks.failed(block, err) from err
                yield message

    async def _from_memory(
        self, data: bytes, digest: str, call: Caller
    ) -> AsyncIterator[hub_pb2.BlockChunk]:
        """A block held in memory (the cache could not take it), charged its size while
        it is sent."""
        with self.gate.in_memory(call, len(data)):
            view = memoryview(data)
            for offset in range(0, max(len(data), 1), SERVE_CHUNK_BYTES):
                end = offset + SERVE_CHUNK_BYTES
                yield hub_pb2.BlockChunk(
                    digest=digest,
                    offset=offset,
                    data=bytes(view[offset:end]),
                    block_size=len(data),
                    last=end >= len(data),
                )


def _said(decision: Decision) -> tuple[tuple[str, bytes], ...]:
    """The initial metadata of an answer: the declined digests and the relay hint's."""
    said = []
    for key, digests in (
        (DECLINED_METADATA, decision.declined),
        (RELAY_METADATA, decision.relayed),
    ):
        if digests:
            said.append((key, b"".join(bytes.fromhex(d) for d in digests)))
    return tuple(said)


def _chunk(block: BlockFile, offset: int, data: bytes) -> hub_pb2.BlockChunk:
    return hub_pb2.BlockChunk(
        digest=block.digest,
        offset=offset,
        data=data,
        block_size=block.size,
        last=offset + block.chunk >= block.size,
    )


class PeerServer:
    """The peer port: its door (:mod:`strata_local.door`) and the gRPC server behind it.

    Attributes:
        door: Accepts and relays the region's connections.
        grpc: The gRPC server, on the door's private Unix socket.
    """

    def __init__(self, door: Door, server: grpc.aio.Server) -> None:
        self.door, self.grpc = door, server

    async def stop(self, grace: float | None) -> None:
        """Stops the gRPC server (calls in flight get ``grace`` seconds), then the door."""
        await self.grpc.stop(grace)
        await self.door.close()


async def start_peer_server(
    service: PeerService,
    listen: str,
    tls: PeerTls | None = None,
    max_connections: int = MAX_CONNECTIONS,
) -> tuple[PeerServer, int]:
    """Serve ``service`` on ``listen`` (``HOST:PORT``; TLS when ``tls`` is given), with at
    most ``max_connections`` connections open at once, held by the door's shares
    (:mod:`strata_local.doorslots`): a connection is kept once a call on it carried the
    region's token, or passed mTLS when the region has no token; without either, none is.

    Returns:
        The started server and the port it bound.

    Raises:
        OSError: the address could not be bound.
    """
    grpclog.install()  # a stream its peer cancelled: one line, not a traceback
    host, port = parse_option_hostport(listen, "--peer-listen")
    mtls = tls is not None and tls.ca is not None
    door = Door(max_connections, service.token is not None or mtls, HANDSHAKE_TIMEOUT_S)
    try:  # the port first: nothing of gRPC's is made when it is taken
        port = await door.start(host, port)
    except OSError as err:
        await door.close()
        raise OSError(f"cannot bind the peer port {listen}: {err}") from err
    server = grpc.aio.server(
        # Probe, the one unary call, is admitted before its request is read (probedoor)
        interceptors=[ProbeDoor(service.admit_probe)],
        options=[
            # requests are small: a request still arriving holds one window (REQUEST_BYTES)
            ("grpc.max_receive_message_length", REQUEST_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            # the door holds the slots; a displaced connection's end reaches gRPC at once
            *server_options(2 * max_connections),
        ],
    )
    peer_pb2_grpc.add_SpokePeerServicer_to_server(service, server)  # type: ignore[no-untyped-call]
    if tls is None:
        bound = server.add_insecure_port(door.backend)
    else:
        bound = server.add_secure_port(door.backend, tls.server_credentials())
    if bound == 0:
        await door.close()
        raise OSError(f"cannot bind the peer port's gRPC socket {door.backend}")
    await server.start()
    service.door = door
    return PeerServer(door, server), port
