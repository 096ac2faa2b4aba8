"""The server side of the peer port: serve this spoke's blocks to the other spokes.

A call is admitted in this order, each refusal counted, audited and logged
(:class:`~spoke.mesh.admission.Refusals`): the region's token (UNAUTHENTICATED); the
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
from collections.abc import AsyncIterator
from typing import Any, NoReturn

import grpc
import grpc.aio

from protocol.grants import DECLINED_METADATA
from protocol.hub.v1 import hub_pb2
from protocol.spoke.v1 import peer_pb2, peer_pb2_grpc
from spoke.cache.blockcache import BlockCache
from spoke.disk.layout import is_digest
from spoke.errors import HubUnavailable, InvalidRequest, NotFound
from spoke.fetch.scheduler import FetchScheduler, Priority
from spoke.mesh import metrics
from spoke.mesh.admission import CallerLimits, Decision, MemoryBudget, Refusals, ScopeCheck
from spoke.mesh.blockfile import BlockFile
from spoke.mesh.grantcheck import GrantRefused, GrantVerifier, caller_of
from spoke.mesh.peerclient import MAX_MESSAGE_BYTES
from spoke.mesh.source import MeshSource
from spoke.mesh.transport import MAX_CONNECTIONS, PeerTls, PeerToken, server_options

MAX_BLOCKS_PER_REQUEST = 256
"""Most blocks one request may name (a spoke's scheduler asks for at most 64)."""

SERVE_CHUNK_BYTES = 256 << 10
"""Block bytes in one chunk sent: at most :data:`~spoke.mesh.peerclient.CHUNK_BYTES` (what
a caller accepts), a multiple of the encryption's 32 KiB segments (a chunk of a sealed
block file opens whole segments), small enough that a stalled call holds little and
large enough that a chunk costs gRPC far less than sending it does."""

CALL_HOLD_BYTES = 5 * SERVE_CHUNK_BYTES
"""What one admitted call is charged in the peer port's :class:`MemoryBudget`: the chunk
on its way out in four copies at most (the bytes read, the message, its serialization,
gRPC core's buffer of it, measured by ``tests/integration/test_spoke_mesh_budget.py``) and
one chunk for the call's own state and the request (:data:`PENDING_HOLD_BYTES` of it is
taken when the call is admitted, the rest once its request names blocks to send). 256 MiB
hold 204 stalled calls."""

PENDING_HOLD_BYTES = 64 << 10
"""What a call is charged in the :class:`MemoryBudget` from its admission until its request
has arrived: gRPC's state of an open call is about 25 KiB (47,000 calls that never sent a
request held an owner at 1.2 GiB), so 256 MiB bound such calls to 4,096 in all, about
100 MiB, however many subjects open them."""

REQUEST_WAIT_S = 5.0
"""Longest an admitted call may take to send its one request, seconds: a peer sends it as
it opens the call; one that does not is holding a call slot of its subject's allowance."""

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

CLASSES = {p.label: p for p in Priority}

_READ = "peer ReadBlocks"
_INVALID = grpc.StatusCode.INVALID_ARGUMENT


def _problem(digests: list[str], unknown_class: str | None) -> str | None:
    """What makes a request malformed (None: nothing)."""
    if len(digests) > MAX_BLOCKS_PER_REQUEST:
        return f"{len(digests)} blocks; at most {MAX_BLOCKS_PER_REQUEST} per request"
    bad = next((d for d in digests if not is_digest(d)), None)
    if bad is not None:
        return f"malformed digest {bad[:80]!r}"
    if len(set(digests)) != len(digests):
        return "a digest named twice"
    if unknown_class is not None:
        return f"unknown request class {unknown_class[:40]!r}"
    return None


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
        self.probing = 0  # Probe calls not done yet (their replies may wait unread)

    async def _refuse(
        self,
        context: grpc.aio.ServicerContext[Any, Any],
        code: grpc.StatusCode,
        reason: str,
        message: str,
        what: str,
        subject: str | None = None,
    ) -> NoReturn:
        """End the call with ``code`` and ``message``, counted and audited as ``reason``.

        A call refused before its request is read ends without reading it: gRPC core drops
        what arrives for it. Our clients send the request with the call's headers (a
        unary-stream call, :mod:`spoke.mesh.peerclient`), so they read this status.
        """
        self.refusals.record(reason, message, who=context.peer(), what=what, subject=subject)
        await context.abort(code, message)
        raise AssertionError("context.abort() returned")  # it always raises

    async def _authorize(
        self,
        context: grpc.aio.ServicerContext[Any, Any],
        what: str,
    ) -> None:
        """The region's token (when the spokes have one)."""
        if self.token is None:
            return
        given = [v for k, v in context.invocation_metadata() or () if k == "authorization"]
        if len(given) != 1 or not self.token.accepts(given[0]):
            await self._refuse(
                context,
                grpc.StatusCode.UNAUTHENTICATED,
                "token",
                "missing or wrong peer token",
                what,
            )

    async def Probe(
        self,
        request: peer_pb2.ProbeRequest,
        context: grpc.aio.ServicerContext[peer_pb2.ProbeRequest, peer_pb2.ProbeResponse],
    ) -> peer_pb2.ProbeResponse:
        """Who this is and how many blocks it holds; at most :data:`PROBE_CALLS` at once
        (a call counts until gRPC reports it done: its reply may wait unread)."""
        await self._authorize(context, "peer Probe")
        if self.probing >= PROBE_CALLS:
            await self._refuse(
                context,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "limit",
                f"{self.probing} Probe calls are open here, the most this peer port takes",
                "peer Probe",
            )
        self.probing += 1
        context.add_done_callback(self._probe_done)
        return peer_pb2.ProbeResponse(node=self.node, cached_blocks=len(self.cache))

    def _probe_done(self, _: object) -> None:
        self.probing -= 1

    async def ReadBlocks(
        self,
        request_iterator: AsyncIterator[peer_pb2.PeerReadRequest],
        context: grpc.aio.ServicerContext[peer_pb2.PeerReadRequest, hub_pb2.BlockChunk],
    ) -> AsyncIterator[hub_pb2.BlockChunk]:
        """Each requested block the caller may have, in order, in chunks of at most
        :data:`SERVE_CHUNK_BYTES`; the others are declined up front."""
        # every refusal before the request is read ends the call without reading it
        await self._authorize(context, _READ)
        try:
            claims = self.verifier.verify(context.invocation_metadata() or (), "ReadBlocks")
        except GrantRefused as err:
            code = grpc.StatusCode.UNAUTHENTICATED
            if err.reason == "busy":
                code = grpc.StatusCode.RESOURCE_EXHAUSTED
            await self._refuse(context, code, err.reason, str(err), _READ)
        subject = f"{claims.subject} at {claims.node}"
        caller = caller_of(claims)
        # the call's slot and memory are taken before its request is read: a caller that
        # opens calls and never sends a request holds them, within its allowance
        with (
            self.limits.admit(caller, 0) as admitted,
            self.memory.hold(caller, PENDING_HOLD_BYTES if admitted else 0) as pending,
        ):
            if not admitted:
                await self._over_limit(context, caller, claims.subject, subject)
            if not pending:
                await self._memory_spent(context, caller, PENDING_HOLD_BYTES, subject)
            request = await self._request(request_iterator, context, subject)
            digests = [b.digest for b in request.blocks]
            asked = CLASSES.get(request.request_class or "demand")
            problem = _problem(digests, request.request_class if asked is None else None)
            if problem is not None:
                await self._refuse(context, _INVALID, "malformed", problem, _READ, subject)
            scopes = list(claims.scopes)
            await self.scope.load(request.snapshots, scopes, caller)
            decision = self.scope.decide(digests, scopes)
            # a call that sends blocks holds CALL_HOLD_BYTES in all, its pending part included
            hold = CALL_HOLD_BYTES - PENDING_HOLD_BYTES if decision.allowed else 0
            with (
                self.limits.admit(caller, decision.nbytes, calls=0) as carried,
                self.memory.hold(caller, hold if carried else 0) as held,
            ):
                if not carried:
                    await self._over_limit(context, caller, claims.subject, subject)
                if not held:
                    await self._memory_spent(context, caller, hold, subject)
                self._declined(decision, len(digests), context.peer(), subject)
                raw = b"".join(bytes.fromhex(d) for d in decision.declined)
                await context.send_initial_metadata(((DECLINED_METADATA, raw),) if raw else ())
                if raw and not decision.allowed:
                    # the call ends at once, and a unary-stream caller can then read empty
                    # initial metadata: the trailers say it again
                    context.set_trailing_metadata(((DECLINED_METADATA, raw),))
                # a peer never preempts this spoke's own demand misses
                priority = max(Priority.PEER, asked or Priority.DEMAND)
                async for chunk in self._serve(
                    decision.allowed, priority, context, caller, subject
                ):
                    yield chunk
            async for _ in request_iterator:
                await self._refuse(
                    context, _INVALID, "malformed", "one request per call", _READ, subject
                )

    async def _request(
        self,
        requests: AsyncIterator[peer_pb2.PeerReadRequest],
        context: grpc.aio.ServicerContext[Any, Any],
        subject: str,
    ) -> peer_pb2.PeerReadRequest:
        """The call's one request, within :data:`REQUEST_WAIT_S`; refuses a call that sends
        none in time (``no_request``) or ends without one (``malformed``)."""
        try:
            return await asyncio.wait_for(anext(requests), REQUEST_WAIT_S)
        except TimeoutError:
            await self._refuse(
                context,
                grpc.StatusCode.DEADLINE_EXCEEDED,
                "no_request",
                f"no request within {REQUEST_WAIT_S:g} s of the call",
                _READ,
                subject,
            )
        except StopAsyncIteration:
            await self._refuse(context, _INVALID, "malformed", "no request", _READ, subject)

    async def _over_limit(
        self,
        context: grpc.aio.ServicerContext[Any, Any],
        caller: str,
        who: str,
        subject: str,
    ) -> NoReturn:
        """Refuse a call over its caller's allowance of calls or bytes in flight."""
        calls, asked_bytes = self.limits.in_flight(caller)
        await self._refuse(
            context,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "limit",
            f"{calls} calls and {asked_bytes:,} bytes in flight here for "
            f"{who}; at most {self.limits.calls} and {self.limits.nbytes:,}",
            _READ,
            subject,
        )

    async def _memory_spent(
        self,
        context: grpc.aio.ServicerContext[Any, Any],
        caller: str,
        nbytes: int,
        subject: str,
    ) -> NoReturn:
        """Refuse a call the peer port's memory cannot take ``nbytes`` more for."""
        budget = self.memory
        await self._refuse(
            context,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "memory",
            f"the peer port holds {budget.held:,} of its {budget.capacity:,} bytes for "
            f"callers ({budget.held_by(caller):,} for this one), {nbytes:,} more asked; "
            "read these blocks from the hub",
            _READ,
            subject,
        )

    def _declined(self, decision: Decision, asked: int, who: str, subject: str) -> None:
        """Count, audit and log the blocks of a request that are not served: one reason
        in the metrics and the log (whether this spoke holds a digest for another tenant
        is nobody else's business); the audit log says which were unknown here."""
        declined = decision.declined
        if not declined:
            return
        metrics.PEER_REFUSED_BLOCKS.inc(len(declined))
        self.refusals.record(
            "declined",
            f"{len(declined)} of {asked} blocks declined, e.g. {declined[0]}",
            who=who,
            what=_READ,
            subject=subject,
            blocks=len(declined),
            audited={"unknown": len(decision.unknown), "outside": len(decision.outside)},
        )

    async def _serve(
        self,
        blocks: list[tuple[str, int]],
        priority: Priority,
        context: grpc.aio.ServicerContext[Any, Any],
        caller: str,
        subject: str,
    ) -> AsyncIterator[hub_pb2.BlockChunk]:
        if not blocks:
            return
        with self.source.serving([d for d, _ in blocks]):
            # queue every miss at once, then send in order as each arrives
            self.scheduler.prefetch(blocks, priority)
            for digest, size in blocks:
                try:
                    block = await self._block(digest, size, priority)
                except NotFound as err:
                    await context.abort(grpc.StatusCode.NOT_FOUND, str(err))
                except InvalidRequest as err:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
                except HubUnavailable as err:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
                if isinstance(block, bytes):
                    chunks = self._from_memory(block, digest, context, caller, subject)
                else:
                    chunks = self._from_file(block, context)
                async for chunk in chunks:
                    yield chunk

    async def _from_file(
        self, block: BlockFile, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[hub_pb2.BlockChunk]:
        """A checked block file's chunks, each read when the one before has been taken."""
        with block:
            for offset in block.offsets():
                try:  # the bytes read live on in the message only, while it is sent
                    message = _chunk(block, offset, await asyncio.to_thread(block.read, offset))
                except (OSError, ValueError) as err:  # CorruptBlock is a ValueError
                    self.cache.drop(block.digest)
                    await context.abort(
                        grpc.StatusCode.NOT_FOUND,
                        f"block {block.digest} failed here after it was checked: {err}",
                    )
                yield message

    async def _from_memory(
        self,
        data: bytes,
        digest: str,
        context: grpc.aio.ServicerContext[Any, Any],
        caller: str,
        subject: str,
    ) -> AsyncIterator[hub_pb2.BlockChunk]:
        """A block held in memory (the cache could not take it), charged its size while
        it is sent."""
        with self.memory.hold(caller, len(data)) as held:
            if not held:
                await self._memory_spent(context, caller, len(data), subject)
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

    async def _block(self, digest: str, size: int, priority: Priority) -> BlockFile | bytes:
        """One block, checked, fetched into the cache first if need be: its open file, or
        its bytes when the cache could not take it.

        Raises:
            HubUnavailable, NotFound, InvalidRequest: the fetch failed.
        """
        for _ in range(3):
            was_cached, uncached = await self.scheduler.ensure([(digest, size)], priority)
            if digest in uncached:  # the cache could not take it: sent from memory
                metrics.PEER_SERVED_BYTES.labels("fetched").inc(len(uncached[digest]))
                return uncached[digest]
            # checked (and decrypted, with encryption at rest) a chunk at a time
            block = await asyncio.to_thread(
                BlockFile.open, self.cache.store, digest, size, SERVE_CHUNK_BYTES
            )
            if block is None:  # evicted between the fetch and the read, or damaged on disk
                self.cache.drop(digest)
                continue
            self.cache.record_access([digest])
            how = "cache" if was_cached[0] else "fetched"
            metrics.PEER_SERVED_BYTES.labels(how).inc(size)
            return block
        raise HubUnavailable(f"block {digest} could not be kept long enough to serve it")


def _chunk(block: BlockFile, offset: int, data: bytes) -> hub_pb2.BlockChunk:
    return hub_pb2.BlockChunk(
        digest=block.digest,
        offset=offset,
        data=data,
        block_size=block.size,
        last=offset + block.chunk >= block.size,
    )


async def start_peer_server(
    service: PeerService,
    listen: str,
    tls: PeerTls | None = None,
    max_connections: int = MAX_CONNECTIONS,
) -> tuple[grpc.aio.Server, int]:
    """Serve ``service`` on ``listen`` (``HOST:PORT``; TLS when ``tls`` is given), with at
    most ``max_connections`` connections open at once (:mod:`spoke.mesh.transport`).

    Returns:
        The started server and the port it bound.

    Raises:
        OSError: the address could not be bound.
    """
    server = grpc.aio.server(
        options=[
            # requests are small: a request still arriving holds one window (REQUEST_BYTES)
            ("grpc.max_receive_message_length", REQUEST_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
            *server_options(max_connections),
        ]
    )
    peer_pb2_grpc.add_SpokePeerServicer_to_server(service, server)  # type: ignore[no-untyped-call]
    if tls is None:
        port = server.add_insecure_port(listen)
    else:
        port = server.add_secure_port(listen, tls.server_credentials())
    if port == 0:
        raise OSError(f"cannot bind the peer port {listen}")
    await server.start()
    return server, port
