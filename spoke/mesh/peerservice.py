"""The server side of the peer port: serve this spoke's blocks to the other spokes.

A block asked for is served from the cache, or fetched from the hub through this spoke's
own scheduler (one single-flight entry, so every spoke of the region asking for it at once
makes one hub fetch) and then kept here: the owner holds the region's copy. Serving a
block counts as a read in the owner's eviction policy, so blocks the region reads stay
cached at their owner — a placement hint, not a pin. Blocks read back from disk are
verified before they are sent; a bad one is dropped and fetched again.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator

import grpc
import grpc.aio

from protocol.hub.v1 import hub_pb2
from protocol.spoke.v1 import peer_pb2, peer_pb2_grpc
from spoke.cache import BlockCache
from spoke.errors import HubUnavailable, InvalidRequest, NotFound
from spoke.layout import is_digest
from spoke.mesh import metrics
from spoke.mesh.peerclient import CHUNK_BYTES, MAX_MESSAGE_BYTES, PeerTls
from spoke.mesh.source import MeshSource
from spoke.scheduler import FetchScheduler, Priority

MAX_BLOCKS_PER_REQUEST = 1024
CLASSES = {p.label: p for p in Priority}


class PeerService(peer_pb2_grpc.SpokePeerServicer):
    """The ``SpokePeer`` gRPC service.

    Args:
        node: this spoke's name in the mesh (answered to probes).
        cache: the block cache.
        scheduler: fetches what is not cached (its source is ``source``).
        source: the mesh source, told which blocks peers asked for (those go to the hub).
        token: the region's token, or None to accept calls without one.
    """

    def __init__(
        self,
        node: str,
        cache: BlockCache,
        scheduler: FetchScheduler,
        source: MeshSource,
        token: str | None = None,
    ) -> None:
        self.node = node
        self.cache = cache
        self.scheduler = scheduler
        self.source = source
        self._token = f"Bearer {token}".encode() if token else None

    async def _authorize(self, context: grpc.aio.ServicerContext[object, object]) -> None:
        if self._token is None:
            return
        given = dict(context.invocation_metadata() or ()).get("authorization", "")
        raw = given.encode() if isinstance(given, str) else bytes(given)
        if not secrets.compare_digest(raw, self._token):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong peer token")

    async def Probe(
        self,
        request: peer_pb2.ProbeRequest,
        context: grpc.aio.ServicerContext[peer_pb2.ProbeRequest, peer_pb2.ProbeResponse],
    ) -> peer_pb2.ProbeResponse:
        """Who this is and how many blocks it holds."""
        await self._authorize(context)  # type: ignore[arg-type]
        return peer_pb2.ProbeResponse(node=self.node, cached_blocks=len(self.cache))

    async def ReadBlocks(
        self,
        request_iterator: AsyncIterator[peer_pb2.PeerReadRequest],
        context: grpc.aio.ServicerContext[peer_pb2.PeerReadRequest, hub_pb2.BlockChunk],
    ) -> AsyncIterator[hub_pb2.BlockChunk]:
        """Each requested block, in order, in chunks of at most :data:`CHUNK_BYTES`."""
        await self._authorize(context)  # type: ignore[arg-type]
        async for request in request_iterator:
            blocks = [(b.digest, b.size) for b in request.blocks]
            bad = next((d for d, _ in blocks if not is_digest(d)), None)
            if bad is not None or len(blocks) > MAX_BLOCKS_PER_REQUEST:
                what = f"malformed digest {bad!r}" if bad is not None else "too many blocks"
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, what)
            priority = CLASSES.get(request.request_class or "demand")
            if priority is None:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"unknown request class {request.request_class!r}",
                )
                return
            with self.source.serving([d for d, _ in blocks]):
                # queue every miss at once, then send in order as each arrives
                self.scheduler.prefetch(blocks, priority)
                for digest, size in blocks:
                    try:
                        data = await self._block(digest, size, priority)
                    except NotFound as err:
                        await context.abort(grpc.StatusCode.NOT_FOUND, str(err))
                    except InvalidRequest as err:
                        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
                    except HubUnavailable as err:
                        await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
                    view = memoryview(data)
                    for offset in range(0, max(len(data), 1), CHUNK_BYTES):
                        end = offset + CHUNK_BYTES
                        yield hub_pb2.BlockChunk(
                            digest=digest,
                            offset=offset,
                            data=bytes(view[offset:end]),
                            block_size=len(data),
                            last=end >= len(data),
                        )

    async def _block(self, digest: str, size: int, priority: Priority) -> bytes:
        """The verified bytes of one block, fetched into the cache first if need be.

        Raises:
            HubUnavailable, NotFound, InvalidRequest: the fetch failed.
        """
        for _ in range(3):
            was_cached, uncached = await self.scheduler.ensure([(digest, size)], priority)
            if digest in uncached:  # the cache could not take it: sent from memory
                metrics.PEER_SERVED_BYTES.labels("fetched").inc(len(uncached[digest]))
                return uncached[digest]
            # verified (and decrypted, with encryption at rest) as read
            data = await asyncio.to_thread(self.cache.store.read, digest)
            if data is None:  # evicted between the fetch and the read, or damaged on disk
                self.cache.drop(digest)
                continue
            self.cache.record_access([digest])
            how = "cache" if was_cached[0] else "fetched"
            metrics.PEER_SERVED_BYTES.labels(how).inc(len(data))
            return data
        raise HubUnavailable(f"block {digest} could not be kept long enough to serve it")


async def start_peer_server(
    service: PeerService, listen: str, tls: PeerTls | None = None
) -> tuple[grpc.aio.Server, int]:
    """Serve ``service`` on ``listen`` (``HOST:PORT``; TLS when ``tls`` is given).

    Returns:
        The started server and the port it bound.

    Raises:
        OSError: the address could not be bound.
    """
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
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
