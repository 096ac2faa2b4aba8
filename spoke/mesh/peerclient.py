"""The client side of the peer port: one gRPC channel to one other spoke of the region.

Every call carries the region's token; block reads also carry this spoke's read grant and
a proof of possession made for that peer (:mod:`spoke.mesh.grants`). A peer's answer is
held to the sizes in this spoke's own manifests: a block is cut off, and the peer counted
as lying, the moment it sends a byte more than the block's size, ends it short, or names
another size; so a flooding peer costs at most one gRPC message (:data:`MAX_MESSAGE_BYTES`).

A read is also held to a pace (:class:`Pace`): block *k* of a stream must have arrived
``step_timeout`` plus the bytes of blocks 0..*k* at :data:`MIN_RATE_BPS` after the call
started, and no wait for a chunk may pass ``step_timeout``; a peer that falls behind
(``slow``: a trickle of valid chunks) or goes silent (``timeout``) is cut off at once.
The whole call ends at the budget its caller gives it (``deadline``), whatever the pace.

Errors are :class:`PeerError` with a ``kind`` (the label of
``strata_spoke_peer_errors_total``); the caller falls back to the hub on any of them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import TypeVar

import grpc
import grpc.aio

from protocol.grants import DECLINED_METADATA
from protocol.hub.v1 import hub_pb2
from protocol.spoke.v1 import peer_pb2, peer_pb2_grpc
from spoke.mesh.grants import GrantKeeper
from spoke.mesh.relay import RELAY_METADATA
from spoke.mesh.transport import PeerTls, PeerToken

MAX_MESSAGE_BYTES = 8 << 20
CHUNK_BYTES = 1 << 20
"""Largest ``BlockChunk.data`` the peer service sends."""

_T = TypeVar("_T")

OLD_CHANNEL_GRACE = 60.0
"""Seconds calls in flight on a channel replaced by new certificates get to finish."""

MIN_RATE_BPS = 1 << 20
"""Slowest pace a peer may keep, bytes per second (1 MiB/s, 8 Mbit/s: far below a region's
network or an owner's share of the hub link, so an honest peer never falls behind it; a
4 MiB block gets 4 s on top of ``step_timeout``)."""


READ_BLOCKS = f"/{peer_pb2.DESCRIPTOR.services_by_name['SpokePeer'].full_name}/ReadBlocks"


def read_blocks_call(
    channel: grpc.aio.Channel,
) -> grpc.aio.UnaryStreamMultiCallable[peer_pb2.PeerReadRequest, hub_pb2.BlockChunk]:
    """``SpokePeer.ReadBlocks`` called in the shape of a unary-stream call: the same bytes
    on the wire (one request, then the half-close), but sent by gRPC core in one batch with
    the call's headers. A peer refuses a call before it reads the request
    (:mod:`spoke.mesh.peerservice`); a request-streaming call whose status came before its
    write would report its own failed write (INTERNAL) instead of that status."""
    return channel.unary_stream(
        READ_BLOCKS,
        request_serializer=peer_pb2.PeerReadRequest.SerializeToString,
        response_deserializer=hub_pb2.BlockChunk.FromString,
    )


class PeerError(Exception):
    """A peer call failed; ``kind`` says how (unavailable, timeout, refused, lying, …)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _kind(err: grpc.aio.AioRpcError) -> str:
    return kind_of(err.code())


def kind_of(code: grpc.StatusCode) -> str:
    """The ``kind`` of a :class:`PeerError` for a peer call that ended with ``code``
    (either port)."""
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return "deadline"  # the caller's budget (the pace is kept here, and fires first)
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return "refused"
    if code == grpc.StatusCode.UNAVAILABLE:
        return "unavailable"
    return str(code.name).lower()


def declined_digests(
    metadata: Sequence[tuple[str, str | bytes]] | None, key: str = DECLINED_METADATA
) -> list[str]:
    """The digests a peer's initial metadata says it will not serve (``key``: or sends
    to their relay, :data:`~spoke.mesh.relay.RELAY_METADATA`)."""
    out: list[str] = []
    for name, value in metadata or ():
        if name == key and isinstance(value, bytes):
            out += [value[i : i + 16].hex() for i in range(0, len(value) - 15, 16)]
    return out


class Pace:
    """When each block of one stream is due, and why a wait ended.

    Args:
        node: the peer (for messages).
        step_timeout: longest wait for any chunk (or the initial metadata), seconds.
        min_rate: slowest pace, bytes per second.
        end: the caller's budget, monotonic seconds.
        now: the monotonic clock.
    """

    def __init__(
        self,
        node: str,
        step_timeout: float,
        min_rate: float,
        end: float,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node = node
        self.step_timeout = step_timeout
        self.min_rate = min_rate
        self.end = end
        self._now = now
        self.start = now()
        self.due = self.start + step_timeout  # of what is awaited now
        self._bytes = 0  # sizes of the blocks awaited so far, this one included

    def expect(self, size: int) -> None:
        """The next block awaited has ``size`` bytes."""
        self._bytes += size
        self.due = self.start + self.step_timeout + self._bytes / self.min_rate

    async def wait(self, awaitable: Awaitable[_T], what: str) -> _T:
        """``awaitable``'s result, or a :class:`PeerError` when the step, the block's due
        time or the budget passes first (``timeout``, ``slow``, ``deadline``)."""
        now = self._now()
        step = now + self.step_timeout
        limit = min(step, self.due, self.end)
        try:
            return await asyncio.wait_for(awaitable, max(limit - now, 0.0))
        except TimeoutError:
            pass
        if limit == self.end and self.end < min(step, self.due):
            raise PeerError(
                "deadline", f"peer {self.node}: the read's time ran out waiting for {what}"
            ) from None
        if limit == self.due and self.due < step:
            raise PeerError(
                "slow",
                f"peer {self.node} kept under {self.min_rate:,.0f} bytes/s (waiting for {what})",
            ) from None
        raise PeerError(
            "timeout", f"peer {self.node} sent nothing for {self.step_timeout:g} s"
        ) from None


class PeerClient:
    """Calls to one peer.

    Args:
        node: the peer's ``HOST:PORT``.
        token: the region's token, or None (only with ``--peer-insecure``).
        tls: TLS files, or None for a plaintext channel (only with ``--peer-insecure``).
        grants: this spoke's read grant (None: block reads carry none and are refused).
    """

    def __init__(
        self,
        node: str,
        token: PeerToken | None = None,
        tls: PeerTls | None = None,
        grants: GrantKeeper | None = None,
    ) -> None:
        self.node = node
        self.token = token
        self.tls = tls
        self.grants = grants
        self._old: set[asyncio.Task[None]] = set()
        self._generation = tls.generation if tls is not None else 0
        self._channel = self._open()
        self._stub = peer_pb2_grpc.SpokePeerStub(self._channel)
        self._read = read_blocks_call(self._channel)

    def _open(self) -> grpc.aio.Channel:
        options: list[tuple[str, str | int]] = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1_000),
        ]
        if self.tls is None:
            return grpc.aio.insecure_channel(self.node, options=options)
        options += self.tls.channel_options()
        return grpc.aio.secure_channel(self.node, self.tls.channel_credentials(), options)

    def _call(self, method: str | None) -> tuple[peer_pb2_grpc.SpokePeerStub, tuple[object, ...]]:
        """The stub to use now (a new channel once the certificates changed) and the call's
        metadata: the token, and for ``method`` the grant and a proof for this peer."""
        if self.tls is not None and self.tls.client_generation() != self._generation:
            self._generation = self.tls.generation
            old = self._channel
            self._channel = self._open()
            self._stub = peer_pb2_grpc.SpokePeerStub(self._channel)
            self._read = read_blocks_call(self._channel)
            task = asyncio.get_running_loop().create_task(old.close(OLD_CHANNEL_GRACE))
            self._old.add(task)
            task.add_done_callback(self._old.discard)
        metadata: tuple[object, ...] = self.token.metadata() if self.token is not None else ()
        if method is not None and self.grants is not None:
            metadata += self.grants.metadata(self.node, method)
        return self._stub, metadata

    async def close(self) -> None:
        """Close the channel, cancelling calls in flight (on replaced channels too)."""
        await self._channel.close()
        for task in list(self._old):
            task.cancel()
        await asyncio.gather(*self._old, return_exceptions=True)

    async def probe(self, timeout: float) -> peer_pb2.ProbeResponse:
        """Ask the peer who it is.

        Raises:
            PeerError: no answer within ``timeout`` seconds, or an error.
        """
        stub, metadata = self._call(None)
        try:
            reply: peer_pb2.ProbeResponse = await stub.Probe(
                peer_pb2.ProbeRequest(), timeout=timeout, metadata=metadata
            )
        except grpc.aio.AioRpcError as err:
            raise PeerError(_kind(err), f"peer {self.node}: {err.details()}") from err
        return reply

    async def read_blocks(
        self,
        blocks: Sequence[tuple[str, int]],
        request_class: str,
        timeout: float,
        step_timeout: float,
        snapshots: Sequence[tuple[str, str, str]] = (),
        on_declined: Callable[[list[str]], None] = lambda digests: None,
        min_rate: float = MIN_RATE_BPS,
        on_relay: Callable[[list[str]], None] | None = None,
        relay: bool = False,
    ) -> AsyncIterator[tuple[str, bytes]]:
        """Stream whole blocks, ``(digest, bytes)`` in request order, not yet verified.

        Args:
            blocks: ``(digest, size)`` wanted, each digest once; the sizes are this
                spoke's (from its manifests) and cap what the peer may send.
            request_class: the asker's class (``demand``, …).
            timeout: budget of the whole stream, seconds.
            step_timeout: longest wait for any one chunk, seconds (a slow peer is skipped).
            snapshots: ``(dataset, version, snapshot id)`` the blocks come from (a hint
                that lets the owner load their manifests).
            on_declined: called once, before any block, with the digests the peer will
                not serve (they are not yielded).
            min_rate: the slowest pace the peer may keep, bytes per second (:class:`Pace`).
            on_relay: given, the call follows relay hints (:mod:`spoke.mesh.relay`): it is
                called once, before any block, with the digests the owner sends to their
                relay (they are not yielded).
            relay: the call is a relay request (the owner sent this spoke here).

        Raises:
            PeerError: the call failed, the peer sent nothing for ``step_timeout``
                (``timeout``) or fell behind the pace (``slow``), the budget ran out
                (``deadline``), the stream came out of order (``protocol``), or a block
                did not keep to its size (``lying``).
        """
        request = peer_pb2.PeerReadRequest(
            blocks=[hub_pb2.BlockRef(digest=d, size=s) for d, s in blocks],
            request_class=request_class,
            snapshots=[
                peer_pb2.SnapshotRef(dataset=d, version=v, snapshot_id=i) for d, v, i in snapshots
            ],
            follows_relays=on_relay is not None,
            relay=relay,
        )
        _, metadata = self._call("ReadBlocks")
        pace = Pace(self.node, step_timeout, min_rate, time.monotonic() + timeout)
        call = self._read(request, timeout=timeout, metadata=metadata)
        sizes = dict(blocks)
        try:
            initial = await pace.wait(call.initial_metadata(), "its answer")
            skip = self._skipped(initial, sizes, on_declined, on_relay)
            expected = iter([d for d, _ in blocks if d not in skip])
            served = False
            async for digest, data in self._blocks(call, expected, sizes, pace):
                served = True
                yield digest, data
            if not skip and not served:
                # a call that declines everything ends at once, and its initial metadata
                # can reach a unary-stream caller empty; the peer repeats it in its trailers
                trailing = await pace.wait(call.trailing_metadata(), "its status")
                self._skipped(trailing, sizes, on_declined, on_relay)
        except grpc.aio.AioRpcError as err:
            raise PeerError(_kind(err), f"peer {self.node}: {err.details()}") from err
        finally:
            call.cancel()

    @staticmethod
    def _skipped(
        metadata: Sequence[tuple[str, str | bytes]] | None,
        sizes: dict[str, int],
        on_declined: Callable[[list[str]], None],
        on_relay: Callable[[list[str]], None] | None,
    ) -> set[str]:
        """The digests ``metadata`` says the peer will not send, handed to ``on_declined``
        and (relay hints, when the call follows them) ``on_relay``."""
        declined = [d for d in declined_digests(metadata) if d in sizes]
        if declined:
            on_declined(declined)
        hinted: list[str] = []
        if on_relay is not None:
            hinted = [d for d in declined_digests(metadata, RELAY_METADATA) if d in sizes]
            hinted = [d for d in hinted if d not in set(declined)]
            if hinted:
                on_relay(hinted)
        return set(declined) | set(hinted)

    async def _blocks(
        self,
        call: grpc.aio.UnaryStreamCall[peer_pb2.PeerReadRequest, hub_pb2.BlockChunk],
        expected: Iterator[str],
        sizes: dict[str, int],
        pace: Pace,
    ) -> AsyncIterator[tuple[str, bytes]]:
        buf = bytearray()
        current = next(expected, None)
        size = sizes.get(current or "", 0)
        pace.expect(size)
        while current is not None:  # the stream's end is not awaited once all arrived
            chunk = await pace.wait(call.read(), f"block {current}")
            if chunk is grpc.aio.EOF:
                return  # short: the caller fetches what is missing elsewhere
            assert isinstance(chunk, hub_pb2.BlockChunk)
            if chunk.digest != current or chunk.offset != len(buf):
                raise PeerError(
                    "protocol",
                    f"peer {self.node} out of order: got {chunk.digest}@{chunk.offset}, "
                    f"expected {current}@{len(buf)}",
                )
            end = len(buf) + len(chunk.data)
            if end > size or chunk.block_size != size or (chunk.last != (end == size)):
                raise PeerError(
                    "lying",
                    f"peer {self.node} sent block {current} as {chunk.block_size} bytes, "
                    f"{end} so far{' (last)' if chunk.last else ''}; it has {size}",
                )
            buf += chunk.data
            del chunk
            if end == size:
                data, buf = bytes(buf), bytearray()
                yield current, data
                current = next(expected, None)
                size = sizes.get(current or "", 0)
                pace.expect(size)
