"""The daemon's gRPC client to the hub (grpc.aio).

Unary calls are retried by gRPC's own retry policy (UNAVAILABLE, exponential backoff with
jitter; gRFC A6). Streams are retried by their callers (the fetcher), which know how much of
a stream already arrived.

The target may name several hub replicas (:func:`protocol.address.grpc_target`): the channel
keeps a connection to each and sends calls round-robin to the healthy ones, so a replica
killed under running readers costs the calls in flight on it one retry, on another replica.

Every call carries the spoke's token and goes over a channel built from its current TLS
credentials (:mod:`spoke.hublink.credentials`). When the certificate files change, new calls
go to a new channel; the old one is closed only after :data:`OLD_CHANNEL_GRACE` seconds, so
a block stream in flight finishes on it. A call the hub refuses (token, scope, TLS) records
the reason in :attr:`HubClient.refused` (read by ``/readyz``); any successful call clears it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
import grpc.aio

from protocol.address import grpc_target
from protocol.hub.v1 import hub_pb2, hub_pb2_grpc
from spoke.hublink.credentials import HubCredentials, refusal

log = logging.getLogger(__name__)

OLD_CHANNEL_GRACE = 120.0
"""Seconds calls in flight on a replaced channel get to finish before it closes."""

DIGESTS_PER_REQUEST = 512
"""Most digests sent in one ``ReadBlocksRequest`` (the hub's
``hub.serve.blockstream.MAX_DIGESTS_PER_REQUEST``; the spoke cannot import the hub): a longer
list goes as several requests on one stream."""

MAX_MESSAGE_BYTES = 8 * 1024 * 1024

PACK_BYTES = 1024 * 1024
"""``ReadBlocksRequest.pack_bytes``: the hub may send whole small blocks up to this many
bytes in one message (a 64 KiB block alone in a message cost the hub about 0.5 ms of
CPU, most of it per message; ``bench.prewarm_link``'s small files)."""

PAGE_ENTRIES = 256
"""``GetManifestRequest.page_entries``: manifest entries per message (one message per
entry cost about 0.1 ms of this process's CPU each: 2 s for 16,384 files)."""

_SERVICE_CONFIG = json.dumps(
    {
        # every address the target resolves to (several --hub addresses, or one DNS name
        # with several records: hub replicas over one shared catalog) gets a connection,
        # and calls go round-robin over those whose health service says SERVING (gRFC
        # A17: a replica that lost its catalog, or is shutting down, gets no new calls)
        "loadBalancingConfig": [{"round_robin": {}}],
        "healthCheckConfig": {"serviceName": "protocol.hub.v1.Hub"},
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
        ],
    }
)


class HubClient:
    """A connection to one hub.

    Sixteen methods: one per hub RPC the spoke calls (eight) and the channel's life and the
    one call wrapper they share (retries, status mapping, reconnection).

    A connection that stops answering (a blackholed link) is found dead by keepalive
    pings (HTTP/2 PING every ``keepalive`` seconds, even on idle streams, dead after
    ``keepalive_timeout`` without an answer) and replaced, so calls in flight fail with
    UNAVAILABLE and are retried on a new connection instead of waiting for their deadline.

    Args:
        target: ``HOST:PORT`` of the hub, or several, comma-separated (replicas over one
            shared catalog); see :func:`protocol.address.grpc_target`.
        timeout: per-call deadline for unary calls and manifests, seconds.
        credentials: TLS and token; None for plaintext without a token.
        keepalive, keepalive_timeout: seconds between pings, and before an unanswered
            one closes the connection.
    """

    def __init__(
        self,
        target: str,
        timeout: float = 10.0,
        credentials: HubCredentials | None = None,
        keepalive: float = 10.0,
        keepalive_timeout: float = 5.0,
    ) -> None:
        self.target = target
        self._grpc_target = grpc_target(target)
        self.timeout = timeout
        self.keepalive = keepalive
        self.keepalive_timeout = keepalive_timeout
        self.credentials = credentials if credentials is not None else HubCredentials()
        self.refused: str | None = None
        self._old: set[asyncio.Task[None]] = set()
        self._channel = self._open()
        self._stub = hub_pb2_grpc.HubStub(self._channel)

    def _open(self) -> grpc.aio.Channel:
        options = [
            ("grpc.service_config", _SERVICE_CONFIG),
            ("grpc.enable_retries", 1),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.keepalive_time_ms", int(self.keepalive * 1000)),
            ("grpc.keepalive_timeout_ms", int(self.keepalive_timeout * 1000)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),  # keep pinging idle streams
            ("grpc.http2.ping_timeout_ms", int(self.keepalive_timeout * 1000)),
            ("grpc.initial_reconnect_backoff_ms", 200),
            ("grpc.max_reconnect_backoff_ms", 2_000),
            *self.credentials.channel_options(),
            *self._authority(),
        ]
        material = self.credentials.material
        if material is None:
            return grpc.aio.insecure_channel(self._grpc_target, options=options)
        return grpc.aio.secure_channel(self._grpc_target, material.credentials(), options=options)

    def _authority(self) -> list[tuple[str, str]]:
        """With several addresses, the first one as the channel's authority (the name TLS
        checks the certificate against, unless ``--hub-server-name`` names another): a
        static address list has no one authority of its own."""
        first, sep, _ = self.target.partition(",")
        return [("grpc.default_authority", first.strip())] if sep else []

    def _call(self) -> tuple[hub_pb2_grpc.HubStub, tuple[tuple[str, str], ...]]:
        """The stub to use now and the metadata to send (fresh credentials)."""
        if self.credentials.refresh_tls() is not None:
            old = self._channel
            self._channel = self._open()
            self._stub = hub_pb2_grpc.HubStub(self._channel)
            task = asyncio.get_running_loop().create_task(old.close(OLD_CHANNEL_GRACE))
            self._old.add(task)
            task.add_done_callback(self._old.discard)
        return self._stub, self.credentials.metadata()

    def _failed(self, err: grpc.aio.AioRpcError) -> None:
        """Record why a call failed: a refusal of this spoke (token, TLS) is kept for
        ``/readyz`` until a call succeeds; a dataset outside the token's scope is only
        that call's error."""
        reason = refusal(err, self.target)
        if err.code() == grpc.StatusCode.PERMISSION_DENIED:
            log.warning("%s", reason)
            return
        if reason is not None and reason != self.refused:
            log.error("%s", reason)
        self.refused = reason

    def _ok(self) -> None:
        if self.refused is not None:
            log.info("hub %s accepts this spoke again", self.target)
        self.refused = None

    async def close(self) -> None:
        """Close the channel, cancelling calls in flight (on replaced channels too)."""
        await self._channel.close()
        for task in list(self._old):
            task.cancel()
        await asyncio.gather(*self._old, return_exceptions=True)

    async def _unary(self, method: str, request: object) -> Any:
        """The hub's unary ``method`` with ``request``, this client's deadline and credentials;
        a failure is counted against the channel (:meth:`_failed`) and raised again.

        Raises:
            grpc.aio.AioRpcError: the call failed.
        """
        stub, metadata = self._call()
        try:
            reply = await getattr(stub, method)(request, timeout=self.timeout, metadata=metadata)
        except grpc.aio.AioRpcError as err:
            self._failed(err)
            raise
        self._ok()
        return reply

    async def list_datasets(self) -> hub_pb2.ListDatasetsResponse:
        """Every dataset the hub has (that the token may read)."""
        reply: hub_pb2.ListDatasetsResponse = await self._unary(
            "ListDatasets", hub_pb2.ListDatasetsRequest()
        )
        return reply

    async def list_versions(self, dataset: str) -> hub_pb2.ListVersionsResponse:
        """A dataset's versions and tags. Raises grpc.aio.AioRpcError (NOT_FOUND, …)."""
        reply: hub_pb2.ListVersionsResponse = await self._unary(
            "ListVersions", hub_pb2.ListVersionsRequest(dataset=dataset)
        )
        return reply

    async def resolve_ref(self, dataset: str, ref: str) -> hub_pb2.Snapshot:
        """Resolve a version or tag to its snapshot. Raises grpc.aio.AioRpcError."""
        reply: hub_pb2.Snapshot = await self._unary(
            "ResolveRef", hub_pb2.ResolveRefRequest(dataset=dataset, ref=ref)
        )
        return reply

    async def issue_grant(self, holder_key: bytes, node: str) -> hub_pb2.ReadGrant:
        """A read grant of this spoke's scopes to ``holder_key`` (32 raw bytes), naming
        ``node`` (the regional mesh, :mod:`spoke.mesh.grants`). Raises grpc.aio.AioRpcError."""
        reply: hub_pb2.ReadGrant = await self._unary(
            "IssueGrant", hub_pb2.IssueGrantRequest(holder_key=holder_key, node=node)
        )
        return reply

    async def grant_keys(self) -> hub_pb2.GrantKeysResponse:
        """The public keys the hub signs read grants with. Raises grpc.aio.AioRpcError."""
        reply: hub_pb2.GrantKeysResponse = await self._unary(
            "GrantKeys", hub_pb2.GrantKeysRequest()
        )
        return reply

    async def get_manifest(self, dataset: str, ref: str) -> list[hub_pb2.ManifestEntry]:
        """A snapshot's whole manifest, in path order. Raises grpc.aio.AioRpcError."""
        stub, metadata = self._call()
        request = hub_pb2.GetManifestRequest(dataset=dataset, ref=ref, page_entries=PAGE_ENTRIES)
        call = stub.GetManifest(request, timeout=self.timeout * 6, metadata=metadata)
        entries: list[hub_pb2.ManifestEntry] = []
        try:
            async for entry in call:
                entries.append(entry)
                if entry.more:  # a page: the entries after this one
                    entries += entry.more
                    entry.ClearField("more")
        except grpc.aio.AioRpcError as err:
            self._failed(err)
            raise
        self._ok()
        return entries

    async def watch(self, after_sequence: int) -> AsyncIterator[hub_pb2.CatalogEvent]:
        """Catalog events after ``after_sequence``, then each new one as it happens.

        Raises:
            grpc.aio.AioRpcError: the stream broke (UNAVAILABLE: reconnect and resume;
                OUT_OF_RANGE: the sequence is no longer kept, resynchronise;
                UNAUTHENTICATED: the token was refused).
        """
        stub, metadata = self._call()
        call = stub.Watch(hub_pb2.WatchRequest(after_sequence=after_sequence), metadata=metadata)
        try:
            async for event in call:
                yield event
        except grpc.aio.AioRpcError as err:
            if err.code() != grpc.StatusCode.CANCELLED:
                self._failed(err)
            raise

    async def read_blocks(
        self, digests: Sequence[str], timeout: float
    ) -> AsyncIterator[tuple[str, bytes]]:
        """Stream whole blocks: yields ``(digest, bytes)`` in request order.

        The bytes are as the hub sent them, not yet verified.

        Raises:
            grpc.aio.AioRpcError: the stream failed (the caller retries what is left).
            ValueError: the hub answered out of order or with inconsistent chunk offsets.
        """
        stub, metadata = self._call()
        # one stream; at most DIGESTS_PER_REQUEST a message (the hub's limit)
        requests = [
            hub_pb2.ReadBlocksRequest(
                digests=digests[i : i + DIGESTS_PER_REQUEST], pack_bytes=PACK_BYTES
            )
            for i in range(0, len(digests), DIGESTS_PER_REQUEST)
        ]
        call = stub.ReadBlocks(iter(requests), timeout=timeout, metadata=metadata)
        expected = iter(digests)
        buf = bytearray()
        current: str | None = None
        try:
            async for message in call:
                for chunk in (message, *message.more):
                    if current is None:
                        current = next(expected, "")
                        buf = bytearray()
                    if chunk.offset == 0 and chunk.last and chunk.digest == current and not buf:
                        # a block in one chunk (every block up to the hub's 1 MiB chunk
                        # size): its bytes as they came, without two copies through buf
                        self._ok()
                        yield current, chunk.data
                        current = None
                        continue
                    if chunk.digest != current or chunk.offset != len(buf) or chunk.more:
                        call.cancel()
                        raise ValueError(
                            f"hub stream out of order: got {chunk.digest}@{chunk.offset}, "
                            f"expected {current}@{len(buf)}"
                        )
                    buf += chunk.data
                    if chunk.last:
                        self._ok()
                        yield current, bytes(buf)
                        current = None
        except grpc.aio.AioRpcError as err:
            self._failed(err)
            raise
