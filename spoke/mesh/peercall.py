"""One peer ``ReadBlocks`` call at the owner, whichever port it came on: the gRPC peer
port (:mod:`spoke.mesh.peerservice`) or the bulk peer port (:mod:`spoke.mesh.peerbulk`).

:class:`PeerGate` admits it, in this order, each refusal counted, audited and logged
(:class:`~spoke.mesh.admission.Refusals`) and raised as :class:`PeerRefused` with the
status the caller gets: the region's token (UNAUTHENTICATED, ``token``); the caller's
read grant and its proof of possession (:mod:`spoke.mesh.grantcheck`; UNAUTHENTICATED,
or RESOURCE_EXHAUSTED when the replay cache is ``busy``); the caller's calls in flight
and the port's memory for a pending call (RESOURCE_EXHAUSTED, ``limit``, ``memory``); the
request's shape (INVALID_ARGUMENT, ``malformed``); which blocks may be served to that
grant (:class:`~spoke.mesh.admission.ScopeCheck`: the others are declined); the caller's
bytes in flight and the memory of a call that sends blocks. Only then is anything queued.

:class:`PeerBlocks` then yields each allowed block in order, from the cache or fetched
from the hub through this spoke's own scheduler in its ``peer`` class (one single-flight
entry, so every spoke of the region asking at once makes one hub fetch), checked before
it is sent: its open :class:`~spoke.mesh.blockfile.BlockFile`, or its bytes when the cache
could not take it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NoReturn

import grpc

from protocol.spoke.v1 import peer_pb2
from spoke.cache.blockcache import BlockCache
from spoke.disk.layout import is_digest
from spoke.errors import HubUnavailable, InvalidRequest, NotFound
from spoke.fetch.scheduler import FetchScheduler, Priority
from spoke.mesh import metrics
from spoke.mesh.admission import CallerLimits, Decision, MemoryBudget, Refusals, ScopeCheck
from spoke.mesh.blockfile import BlockFile
from spoke.mesh.grantcheck import GrantRefused, GrantVerifier, caller_of
from spoke.mesh.relay import HotBlocks
from spoke.mesh.source import MeshSource
from spoke.mesh.transport import PeerToken

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
hold 204 stalled calls. A bulk call holds less (one chunk under TLS, none with
``sendfile``) and is charged the same."""

PENDING_HOLD_BYTES = 64 << 10
"""What a call is charged in the :class:`MemoryBudget` from its admission until its request
has arrived: gRPC's state of an open call is about 25 KiB (47,000 calls that never sent a
request held an owner at 1.2 GiB), so 256 MiB bound such calls to 4,096 in all, about
100 MiB, however many subjects open them."""

REQUEST_WAIT_S = 5.0
"""Longest an admitted call may take to send its one request, seconds: a peer sends it as
it opens the call; one that does not is holding a call slot of its subject's allowance."""

CLASSES = {p.label: p for p in Priority}

READ = "peer ReadBlocks"
"""What a refused read is audited as (either port)."""

REGION = "region"
"""Who proves a peer port's connection (:meth:`strata_local.doorslots.DoorSlots.prove`):
every caller shows the one region token, so its slots are shared by address, and the
oldest turned over rather than a newcomer refused for ever."""

_INVALID = grpc.StatusCode.INVALID_ARGUMENT


class PeerRefused(Exception):
    """The call ends with ``code`` and ``message`` (a refusal already recorded, or a
    fetch that failed)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def problem(digests: Sequence[str], unknown_class: str | None) -> str | None:
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


@dataclass(frozen=True)
class Caller:
    """Who an admitted call is from: ``who`` its transport address (gRPC's form),
    ``name`` the grant's subject, ``caller`` the key of its allowances
    (:func:`~spoke.mesh.grantcheck.caller_of`), ``subject`` as audited, ``scopes`` the
    grant's datasets, ``node`` the mesh node name in its grant (who asked, for the relay
    hints: :class:`~spoke.mesh.relay.HotBlocks`)."""

    who: str
    name: str
    caller: str
    subject: str
    scopes: tuple[str, ...]
    node: str = ""


class PeerGate:
    """The owner's admission of peer reads (see the module docstring).

    Args:
        verifier: checks callers' grants and proofs.
        scope: decides which blocks a grant may be served.
        token: the region's token, or None to accept calls without one.
        limits: per-caller limits.
        refusals: where refusals are counted and audited.
        memory: the peer port's memory for callers.
    """

    def __init__(
        self,
        verifier: GrantVerifier,
        scope: ScopeCheck,
        token: PeerToken | None,
        limits: CallerLimits,
        refusals: Refusals,
        memory: MemoryBudget,
    ) -> None:
        self.verifier, self.scope, self.token = verifier, scope, token
        self.limits, self.refusals, self.memory = limits, refusals, memory
        self.hot = HotBlocks()

    def refuse(
        self,
        code: grpc.StatusCode,
        reason: str,
        message: str,
        who: str,
        what: str = READ,
        subject: str | None = None,
    ) -> NoReturn:
        """Counts, audits and logs a refusal for ``reason``, then raises it.

        Raises:
            PeerRefused: always, with ``code`` and ``message``.
        """
        self.refusals.record(reason, message, who=who, what=what, subject=subject)
        raise PeerRefused(code, message)

    def authorize(self, presented: Sequence[str | bytes], who: str, what: str = READ) -> None:
        """The region's token (when the spokes have one): ``presented`` is every
        ``authorization`` value the call carries.

        Raises:
            PeerRefused: UNAUTHENTICATED, not exactly one value, or not the token.
        """
        if self.token is None:
            return
        if len(presented) != 1 or not self.token.accepts(presented[0]):
            code = grpc.StatusCode.UNAUTHENTICATED
            self.refuse(code, "token", "missing or wrong peer token", who, what)

    def verify(self, metadata: Iterable[tuple[str, str | bytes]], who: str) -> Caller:
        """The caller of a read whose metadata carries a grant and a proof that pass.

        Raises:
            PeerRefused: UNAUTHENTICATED (RESOURCE_EXHAUSTED when ``busy``), the
                :class:`~spoke.mesh.grantcheck.GrantRefused` reason recorded.
        """
        try:
            claims = self.verifier.verify(metadata, "ReadBlocks")
        except GrantRefused as err:
            code = grpc.StatusCode.UNAUTHENTICATED
            if err.reason == "busy":
                code = grpc.StatusCode.RESOURCE_EXHAUSTED
            self.refuse(code, err.reason, str(err), who)
        subject = f"{claims.subject} at {claims.node}"
        return Caller(
            who, claims.subject, caller_of(claims), subject, tuple(claims.scopes), claims.node
        )

    @contextlib.contextmanager
    def pending(self, call: Caller) -> Iterator[None]:
        """While inside, the call holds a call slot of its caller and
        :data:`PENDING_HOLD_BYTES` of the port's memory.

        Raises:
            PeerRefused: RESOURCE_EXHAUSTED (``limit``, ``memory``).
        """
        with (
            self.limits.admit(call.caller, 0) as admitted,
            self.memory.hold(call.caller, PENDING_HOLD_BYTES if admitted else 0) as pending,
        ):
            if not admitted:
                self.over_limit(call)
            if not pending:
                self.memory_spent(call, PENDING_HOLD_BYTES)
            yield

    async def decide(
        self,
        call: Caller,
        digests: Sequence[str],
        request_class: str,
        snapshots: Sequence[peer_pb2.SnapshotRef],
    ) -> tuple[Decision, Priority]:
        """Which blocks of a request may be served (the manifests it names loaded first,
        within limits) and the class to fetch them in: a peer never preempts this spoke's
        own demand misses.

        Raises:
            PeerRefused: INVALID_ARGUMENT (``malformed``).
        """
        asked = CLASSES.get(request_class or "demand")
        wrong = problem(digests, request_class if asked is None else None)
        if wrong is not None:
            self.refuse(_INVALID, "malformed", wrong, call.who, READ, call.subject)
        scopes = list(call.scopes)
        await self.scope.load(snapshots, scopes, call.caller)
        return self.scope.decide(digests, scopes), max(Priority.PEER, asked or Priority.DEMAND)

    def hint(self, call: Caller, decision: Decision, request: peer_pb2.PeerReadRequest) -> None:
        """Move the allowed blocks that are hot (:class:`~spoke.mesh.relay.HotBlocks`) to
        ``decision.relayed``, when the caller follows relay hints and this is not a relay
        request; a call's blocks the caller may not have are declined first, as ever."""
        if not request.follows_relays or request.relay or not call.node:
            return
        kept: list[tuple[str, int]] = []
        for digest, size in decision.allowed:
            if self.hot.asked(digest, call.node):
                decision.relayed.append(digest)
            else:
                kept.append((digest, size))
        if decision.relayed:
            decision.allowed = kept
            metrics.RELAY_REDIRECTED_BLOCKS.inc(len(decision.relayed))

    @contextlib.contextmanager
    def carry(self, call: Caller, decision: Decision) -> Iterator[None]:
        """While inside, the call holds the bytes of the blocks it is sent and (when it
        sends any) the rest of :data:`CALL_HOLD_BYTES`; the declined blocks are recorded
        on entry.

        Raises:
            PeerRefused: RESOURCE_EXHAUSTED (``limit``, ``memory``).
        """
        hold = CALL_HOLD_BYTES - PENDING_HOLD_BYTES if decision.allowed else 0
        with (
            self.limits.admit(call.caller, decision.nbytes, calls=0) as carried,
            self.memory.hold(call.caller, hold if carried else 0) as held,
        ):
            if not carried:
                self.over_limit(call)
            if not held:
                self.memory_spent(call, hold)
            self.declined(decision, call)
            yield

    @contextlib.contextmanager
    def in_memory(self, call: Caller, nbytes: int) -> Iterator[None]:
        """While inside, ``nbytes`` of a block sent from memory are held for the call.

        Raises:
            PeerRefused: RESOURCE_EXHAUSTED (``memory``).
        """
        with self.memory.hold(call.caller, nbytes) as held:
            if not held:
                self.memory_spent(call, nbytes)
            yield

    def over_limit(self, call: Caller) -> NoReturn:
        """Refuse a call over its caller's allowance of calls or bytes in flight."""
        calls, asked_bytes = self.limits.in_flight(call.caller)
        self.refuse(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "limit",
            f"{calls} calls and {asked_bytes:,} bytes in flight here for "
            f"{call.name}; at most {self.limits.calls} and {self.limits.nbytes:,}",
            call.who,
            READ,
            call.subject,
        )

    def memory_spent(self, call: Caller, nbytes: int) -> NoReturn:
        """Refuse a call the peer port's memory cannot take ``nbytes`` more for."""
        budget = self.memory
        self.refuse(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "memory",
            f"the peer port holds {budget.held:,} of its {budget.capacity:,} bytes for "
            f"callers ({budget.held_by(call.caller):,} for this one), {nbytes:,} more asked; "
            "read these blocks from the hub",
            call.who,
            READ,
            call.subject,
        )

    def declined(self, decision: Decision, call: Caller) -> None:
        """Count, audit and log the blocks of a request that are not served: one reason
        in the metrics and the log (whether this spoke holds a digest for another tenant
        is nobody else's business); the audit log says which were unknown here."""
        declined = decision.declined
        if not declined:
            return
        metrics.PEER_REFUSED_BLOCKS.inc(len(declined))
        asked = len(declined) + len(decision.allowed)
        self.refusals.record(
            "declined",
            f"{len(declined)} of {asked} blocks declined, e.g. {declined[0]}",
            who=call.who,
            what=READ,
            subject=call.subject,
            blocks=len(declined),
            audited={"unknown": len(decision.unknown), "outside": len(decision.outside)},
        )


class PeerBlocks:
    """The blocks an admitted call is sent, each checked (see the module docstring).

    Args:
        cache: the block cache.
        scheduler: fetches what is not cached.
        source: the mesh source, told which blocks peers asked for (those go to the hub).
    """

    def __init__(self, cache: BlockCache, scheduler: FetchScheduler, source: MeshSource) -> None:
        self.cache, self.scheduler, self.source = cache, scheduler, source

    async def serve(
        self, blocks: list[tuple[str, int]], priority: Priority, relay: bool = False
    ) -> AsyncIterator[tuple[str, BlockFile | bytes]]:
        """Each of ``blocks`` (``(digest, size)``) in order, with its open, checked file
        (the caller closes it) or its bytes; every miss is queued at once, fetched from
        the hub (this spoke is their owner) or, for a relay request (``relay``), from this
        spoke's own relay for them (:meth:`~spoke.mesh.source.MeshSource.relaying`).

        Raises:
            PeerRefused: NOT_FOUND, INVALID_ARGUMENT or UNAVAILABLE: the fetch failed
                (the blocks before it were yielded).
        """
        if not blocks:
            return
        with self.source.serving([d for d, _ in blocks], relay):
            self.scheduler.prefetch(blocks, priority)
            for digest, size in blocks:
                try:
                    block = await self._block(digest, size, priority, relay)
                except NotFound as err:
                    raise PeerRefused(grpc.StatusCode.NOT_FOUND, str(err)) from err
                except InvalidRequest as err:
                    raise PeerRefused(grpc.StatusCode.INVALID_ARGUMENT, str(err)) from err
                except HubUnavailable as err:
                    raise PeerRefused(grpc.StatusCode.UNAVAILABLE, str(err)) from err
                yield digest, block

    def failed(self, block: BlockFile, err: Exception) -> PeerRefused:
        """A checked block file that failed while it was sent: dropped from the cache
        (fetched again next time); the call ends NOT_FOUND."""
        self.cache.drop(block.digest)
        return PeerRefused(
            grpc.StatusCode.NOT_FOUND,
            f"block {block.digest} failed here after it was checked: {err}",
        )

    async def _block(
        self, digest: str, size: int, priority: Priority, relay: bool = False
    ) -> BlockFile | bytes:
        """One block, checked, fetched into the cache first if need be: its open file, or
        its bytes when the cache could not take it.

        Raises:
            HubUnavailable, NotFound, InvalidRequest: the fetch failed.
        """
        for _ in range(3):
            was_cached, uncached = await self.scheduler.ensure([(digest, size)], priority)
            if digest in uncached:  # the cache could not take it: sent from memory
                metrics.PEER_SERVED_BYTES.labels("fetched").inc(len(uncached[digest]))
                if relay:
                    metrics.RELAY_SERVED_BLOCKS.labels("fetched").inc()
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
            if relay:
                metrics.RELAY_SERVED_BLOCKS.labels(how).inc()
            return block
        raise HubUnavailable(f"block {digest} could not be kept long enough to serve it")


def snapshot_refs(names: Iterable[tuple[str, str, str]]) -> list[peer_pb2.SnapshotRef]:
    """``(dataset, version, snapshot id)`` hints as the request messages carry them."""
    return [peer_pb2.SnapshotRef(dataset=d, version=v, snapshot_id=i) for d, v, i in names]
