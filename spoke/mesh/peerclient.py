"""The client side of the peer port: one gRPC channel to one other spoke of the region.

Errors are :class:`PeerError` with a ``kind`` (the label of
``strata_spoke_peer_errors_total``); the caller falls back to the hub on any of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio

from protocol.hub.v1 import hub_pb2
from protocol.spoke.v1 import peer_pb2, peer_pb2_grpc

MAX_MESSAGE_BYTES = 8 << 20
CHUNK_BYTES = 1 << 20
"""Largest ``BlockChunk.data`` the peer service sends."""


class PeerError(Exception):
    """A peer call failed; ``kind`` says how (unavailable, timeout, refused, protocol)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class PeerTls:
    """PEM files securing the peer port: the spoke's certificate and key, and the CA that
    peers' certificates must chain to (mTLS when both sides present one)."""

    cert: Path
    key: Path
    ca: Path | None = None

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Client credentials: verify the peer against ``ca``, present our certificate."""
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca.read_bytes() if self.ca else None,
            private_key=self.key.read_bytes(),
            certificate_chain=self.cert.read_bytes(),
        )

    def server_credentials(self) -> grpc.ServerCredentials:
        """Server credentials; with a CA, a client certificate is required (mTLS)."""
        return grpc.ssl_server_credentials(
            [(self.key.read_bytes(), self.cert.read_bytes())],
            root_certificates=self.ca.read_bytes() if self.ca else None,
            require_client_auth=self.ca is not None,
        )


def _kind(err: grpc.aio.AioRpcError) -> str:
    code = err.code()
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return "timeout"
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return "refused"
    if code == grpc.StatusCode.UNAVAILABLE:
        return "unavailable"
    return str(code.name).lower()


class PeerClient:
    """Calls to one peer.

    Args:
        node: the peer's ``HOST:PORT``.
        token: the region's token, sent as ``authorization: Bearer`` metadata, or None.
        tls: TLS files, or None for a plaintext channel.
    """

    def __init__(self, node: str, token: str | None = None, tls: PeerTls | None = None) -> None:
        self.node = node
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        options = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1_000),
        ]
        if tls is None:
            self._channel = grpc.aio.insecure_channel(node, options=options)
        else:
            self._channel = grpc.aio.secure_channel(node, tls.channel_credentials(), options)
        self._stub = peer_pb2_grpc.SpokePeerStub(self._channel)

    async def close(self) -> None:
        """Close the channel, cancelling calls in flight."""
        await self._channel.close()

    async def probe(self, timeout: float) -> peer_pb2.ProbeResponse:
        """Ask the peer who it is.

        Raises:
            PeerError: no answer within ``timeout`` seconds, or an error.
        """
        try:
            reply: peer_pb2.ProbeResponse = await self._stub.Probe(
                peer_pb2.ProbeRequest(), timeout=timeout, metadata=self._metadata
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
    ) -> AsyncIterator[tuple[str, bytes]]:
        """Stream whole blocks, ``(digest, bytes)`` in request order, not yet verified.

        Args:
            blocks: ``(digest, size)`` wanted.
            request_class: the asker's class (``demand``, …), the owner's priority.
            timeout: deadline of the whole stream, seconds.
            step_timeout: longest wait for any one chunk, seconds (a slow peer is skipped).

        Raises:
            PeerError: the call failed, a chunk took longer than ``step_timeout``, or the
                stream came out of order.
        """
        request = peer_pb2.PeerReadRequest(
            blocks=[hub_pb2.BlockRef(digest=d, size=s) for d, s in blocks],
            request_class=request_class,
        )
        call = self._stub.ReadBlocks(iter([request]), timeout=timeout, metadata=self._metadata)
        expected = iter([d for d, _ in blocks])
        buf = bytearray()
        current: str | None = None
        try:
            while True:
                try:
                    chunk = await asyncio.wait_for(call.read(), step_timeout)
                except TimeoutError:
                    raise PeerError(
                        "timeout", f"peer {self.node} sent nothing for {step_timeout:g} s"
                    ) from None
                if chunk is grpc.aio.EOF:
                    break
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
                buf += chunk.data
                if chunk.last:
                    yield current, bytes(buf)
                    current = None
        except grpc.aio.AioRpcError as err:
            raise PeerError(_kind(err), f"peer {self.node}: {err.details()}") from err
        finally:
            call.cancel()
