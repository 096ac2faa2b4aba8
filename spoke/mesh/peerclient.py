"""The client side of the peer port: one gRPC channel to one other spoke of the region.

Every call carries the region's token; block reads also carry this spoke's read grant and
a proof of possession made for that peer (:mod:`spoke.mesh.grants`). A peer's answer is
held to the sizes in this spoke's own manifests: a block is cut off, and the peer counted
as lying, the moment it sends a byte more than the block's size, ends it short, or names
another size; so a flooding peer costs at most one gRPC message (:data:`MAX_MESSAGE_BYTES`).

Errors are :class:`PeerError` with a ``kind`` (the label of
``strata_spoke_peer_errors_total``); the caller falls back to the hub on any of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator, Sequence

import grpc
import grpc.aio

from protocol.grants import DECLINED_METADATA
from protocol.hub.v1 import hub_pb2
from protocol.spoke.v1 import peer_pb2, peer_pb2_grpc
from spoke.mesh.grants import GrantKeeper
from spoke.mesh.transport import PeerTls, PeerToken

MAX_MESSAGE_BYTES = 8 << 20
CHUNK_BYTES = 1 << 20
"""Largest ``BlockChunk.data`` the peer service sends."""

OLD_CHANNEL_GRACE = 60.0
"""Seconds calls in flight on a channel replaced by new certificates get to finish."""


class PeerError(Exception):
    """A peer call failed; ``kind`` says how (unavailable, timeout, refused, lying, …)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _kind(err: grpc.aio.AioRpcError) -> str:
    code = err.code()
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return "timeout"
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return "refused"
    if code == grpc.StatusCode.UNAVAILABLE:
        return "unavailable"
    return str(code.name).lower()


def declined_digests(metadata: Sequence[tuple[str, str | bytes]] | None) -> list[str]:
    """The digests a peer's initial metadata says it will not serve."""
    out: list[str] = []
    for key, value in metadata or ():
        if key == DECLINED_METADATA and isinstance(value, bytes):
            out += [value[i : i + 16].hex() for i in range(0, len(value) - 15, 16)]
    return out


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
    ) -> AsyncIterator[tuple[str, bytes]]:
        """Stream whole blocks, ``(digest, bytes)`` in request order, not yet verified.

        Args:
            blocks: ``(digest, size)`` wanted, each digest once; the sizes are this
                spoke's (from its manifests) and cap what the peer may send.
            request_class: the asker's class (``demand``, …).
            timeout: deadline of the whole stream, seconds.
            step_timeout: longest wait for any one chunk, seconds (a slow peer is skipped).
            snapshots: ``(dataset, version, snapshot id)`` the blocks come from (a hint
                that lets the owner load their manifests).
            on_declined: called once, before any block, with the digests the peer will
                not serve (they are not yielded).

        Raises:
            PeerError: the call failed, a chunk took longer than ``step_timeout``, the
                stream came out of order (``protocol``), or a block did not keep to its
                size (``lying``).
        """
        request = peer_pb2.PeerReadRequest(
            blocks=[hub_pb2.BlockRef(digest=d, size=s) for d, s in blocks],
            request_class=request_class,
            snapshots=[
                peer_pb2.SnapshotRef(dataset=d, version=v, snapshot_id=i) for d, v, i in snapshots
            ],
        )
        stub, metadata = self._call("ReadBlocks")
        call = stub.ReadBlocks(iter([request]), timeout=timeout, metadata=metadata)
        sizes = dict(blocks)
        try:
            try:
                initial = await asyncio.wait_for(call.initial_metadata(), step_timeout)
            except TimeoutError:
                raise PeerError(
                    "timeout", f"peer {self.node} sent nothing for {step_timeout:g} s"
                ) from None
            declined = [d for d in declined_digests(initial) if d in sizes]
            if declined:
                on_declined(declined)
            skip = set(declined)
            expected = iter([d for d, _ in blocks if d not in skip])
            async for digest, data in self._blocks(call, expected, sizes, step_timeout):
                yield digest, data
        except grpc.aio.AioRpcError as err:
            raise PeerError(_kind(err), f"peer {self.node}: {err.details()}") from err
        finally:
            call.cancel()

    async def _blocks(
        self,
        call: grpc.aio.StreamStreamCall[peer_pb2.PeerReadRequest, hub_pb2.BlockChunk],
        expected: Iterator[str],
        sizes: dict[str, int],
        step_timeout: float,
    ) -> AsyncIterator[tuple[str, bytes]]:
        buf = bytearray()
        current: str | None = None
        while True:
            try:
                chunk = await asyncio.wait_for(call.read(), step_timeout)
            except TimeoutError:
                raise PeerError(
                    "timeout", f"peer {self.node} sent nothing for {step_timeout:g} s"
                ) from None
            if chunk is grpc.aio.EOF:
                return
            assert isinstance(chunk, hub_pb2.BlockChunk)
            if current is None:
                current = next(expected, "")
                buf = bytearray()
            if chunk.digest != current or chunk.offset != len(buf):
                raise PeerError(
                    "protocol",
                    f"peer {self.node} out of order: got {chunk.digest}@{chunk.offset}, "
                    f"expected {current}@{len(buf)}",
                )
            size = sizes.get(current, 0)
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
                current = None
