"""The daemon's gRPC client to the hub (grpc.aio).

Unary calls are retried by gRPC's own retry policy (UNAVAILABLE, exponential backoff with
jitter; gRFC A6). Streams are retried by their callers (the fetcher), which know how much of
a stream already arrived.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence

import grpc
import grpc.aio

from protocol.hub.v1 import hub_pb2, hub_pb2_grpc

MAX_MESSAGE_BYTES = 8 * 1024 * 1024

_SERVICE_CONFIG = json.dumps(
    {
        "methodConfig": [
            {
                "name": [
                    {"service": "protocol.hub.v1.Hub", "method": m}
                    for m in ("ListDatasets", "ListVersions", "ResolveRef")
                ],
                "retryPolicy": {
                    "maxAttempts": 4,
                    "initialBackoff": "0.1s",
                    "maxBackoff": "2s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
)


class HubClient:
    """A connection to one hub.

    A connection that stops answering (a blackholed link) is found dead by keepalive
    pings (HTTP/2 PING every ``keepalive`` seconds, even on idle streams, dead after
    ``keepalive_timeout`` without an answer) and replaced, so calls in flight fail with
    UNAVAILABLE and are retried on a new connection instead of waiting for their deadline.

    Args:
        target: ``HOST:PORT`` of the hub.
        timeout: per-call deadline for unary calls and manifests, seconds.
        keepalive, keepalive_timeout: seconds between pings, and before an unanswered
            one closes the connection.
    """

    def __init__(
        self,
        target: str,
        timeout: float = 10.0,
        keepalive: float = 10.0,
        keepalive_timeout: float = 5.0,
    ) -> None:
        self.target = target
        self.timeout = timeout
        self._channel = grpc.aio.insecure_channel(
            target,
            options=[
                ("grpc.service_config", _SERVICE_CONFIG),
                ("grpc.enable_retries", 1),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.keepalive_time_ms", int(keepalive * 1000)),
                ("grpc.keepalive_timeout_ms", int(keepalive_timeout * 1000)),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.max_pings_without_data", 0),  # keep pinging idle streams
                ("grpc.http2.ping_timeout_ms", int(keepalive_timeout * 1000)),
                ("grpc.initial_reconnect_backoff_ms", 200),
                ("grpc.max_reconnect_backoff_ms", 2_000),
            ],
        )
        self._stub = hub_pb2_grpc.HubStub(self._channel)

    async def close(self) -> None:
        """Close the channel, cancelling calls in flight."""
        await self._channel.close()

    async def list_datasets(self) -> hub_pb2.ListDatasetsResponse:
        """Every dataset the hub has."""
        reply: hub_pb2.ListDatasetsResponse = await self._stub.ListDatasets(
            hub_pb2.ListDatasetsRequest(), timeout=self.timeout
        )
        return reply

    async def list_versions(self, dataset: str) -> hub_pb2.ListVersionsResponse:
        """A dataset's versions and tags. Raises grpc.aio.AioRpcError (NOT_FOUND, …)."""
        reply: hub_pb2.ListVersionsResponse = await self._stub.ListVersions(
            hub_pb2.ListVersionsRequest(dataset=dataset), timeout=self.timeout
        )
        return reply

    async def resolve_ref(self, dataset: str, ref: str) -> hub_pb2.Snapshot:
        """Resolve a version or tag to its snapshot. Raises grpc.aio.AioRpcError."""
        reply: hub_pb2.Snapshot = await self._stub.ResolveRef(
            hub_pb2.ResolveRefRequest(dataset=dataset, ref=ref), timeout=self.timeout
        )
        return reply

    async def get_manifest(self, dataset: str, ref: str) -> list[hub_pb2.ManifestEntry]:
        """A snapshot's whole manifest, in path order. Raises grpc.aio.AioRpcError."""
        call = self._stub.GetManifest(
            hub_pb2.GetManifestRequest(dataset=dataset, ref=ref), timeout=self.timeout * 6
        )
        return [entry async for entry in call]

    async def watch(self, after_sequence: int) -> AsyncIterator[hub_pb2.CatalogEvent]:
        """Catalog events after ``after_sequence``, then each new one as it happens.

        Raises:
            grpc.aio.AioRpcError: the stream broke (UNAVAILABLE: reconnect and resume;
                OUT_OF_RANGE: the sequence is no longer kept, resynchronise).
        """
        call = self._stub.Watch(hub_pb2.WatchRequest(after_sequence=after_sequence))
        async for event in call:
            yield event

    async def read_blocks(
        self, digests: Sequence[str], timeout: float
    ) -> AsyncIterator[tuple[str, bytes]]:
        """Stream whole blocks: yields ``(digest, bytes)`` in request order.

        The bytes are as the hub sent them, not yet verified.

        Raises:
            grpc.aio.AioRpcError: the stream failed (the caller retries what is left).
            ValueError: the hub answered out of order or with inconsistent chunk offsets.
        """
        call = self._stub.ReadBlocks(
            iter([hub_pb2.ReadBlocksRequest(digests=list(digests))]), timeout=timeout
        )
        expected = iter(digests)
        buf = bytearray()
        current: str | None = None
        async for chunk in call:
            if current is None:
                current = next(expected, "")
                buf = bytearray()
            if chunk.digest != current or chunk.offset != len(buf):
                call.cancel()
                raise ValueError(
                    f"hub stream out of order: got {chunk.digest}@{chunk.offset}, "
                    f"expected {current}@{len(buf)}"
                )
            buf += chunk.data
            if chunk.last:
                yield current, bytes(buf)
                current = None
