"""The hub's gRPC service (``protocol.hub.v1.Hub``) on grpc.aio.

The servicer translates: it reads the catalog and the blob store and converts records
to messages. Catalog and blob reads block (LMDB, file I/O), so they run in worker
threads (:func:`asyncio.to_thread`) and the event loop keeps serving other streams.

Errors are mapped to gRPC status codes in exactly one place, :func:`status_code`: a
:class:`~hub.errors.HubError` becomes its code with the error's message as details;
anything else is logged and answered ``INTERNAL``. Every finished call is counted in
``strata_hub_requests_total{method,code}``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import grpc

from hub.blobstore import BlobStore
from hub.blocks import MiB
from hub.catalog import Catalog, Snapshot, Tag
from hub.errors import CorruptBlob, CorruptCatalog, HubError, InvalidArgument, NotFound
from hub.manifest import EntryType, ManifestEntry
from hub.metrics import HubMetrics
from hub.names import validate_digest
from protocol.hub.v1 import hub_pb2, hub_pb2_grpc

logger = logging.getLogger(__name__)

CHUNK_BYTES = 1 * MiB
"""Largest ``BlockChunk.data`` sent, bytes; keeps every message far below the size limit."""

MANIFEST_PAGE_ENTRIES = 256
"""Manifest entries read per worker-thread call while streaming GetManifest."""

_STATUS_CODES: tuple[tuple[type[HubError], grpc.StatusCode], ...] = (
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (CorruptBlob, grpc.StatusCode.DATA_LOSS),
    (CorruptCatalog, grpc.StatusCode.DATA_LOSS),
)


def status_code(error: HubError) -> grpc.StatusCode:
    """Maps a domain error to the gRPC status code a client receives.

    Args:
        error: The error.

    Returns:
        ``INVALID_ARGUMENT`` for malformed input, ``NOT_FOUND`` for unknown datasets,
        refs, snapshots and blocks, ``DATA_LOSS`` for corrupt stored data, ``INTERNAL``
        for anything else.
    """
    for error_type, code in _STATUS_CODES:
        if isinstance(error, error_type):
            return code
    return grpc.StatusCode.INTERNAL


_Request = TypeVar("_Request")
_Response = TypeVar("_Response")


def _unary(
    method: Callable[[HubService, _Request, Any], Awaitable[_Response]],
) -> Callable[[HubService, _Request, Any], Awaitable[_Response]]:
    """Wraps a unary handler: maps errors to statuses and counts the call."""

    @functools.wraps(method)
    async def handler(self: HubService, request: _Request, context: Any) -> _Response:
        try:
            response = await method(self, request, context)
        except asyncio.CancelledError:
            self._count(method.__name__, grpc.StatusCode.CANCELLED)
            raise
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await self._abort(method.__name__, context, exc)
        self._count(method.__name__, grpc.StatusCode.OK)
        return response

    return handler


def _streaming(
    method: Callable[[HubService, _Request, Any], AsyncIterator[_Response]],
) -> Callable[[HubService, _Request, Any], AsyncIterator[_Response]]:
    """Wraps a response-streaming handler: maps errors to statuses and counts the call."""

    @functools.wraps(method)
    async def handler(
        self: HubService, request: _Request, context: Any
    ) -> AsyncIterator[_Response]:
        try:
            async for response in method(self, request, context):
                yield response
        except asyncio.CancelledError:
            self._count(method.__name__, grpc.StatusCode.CANCELLED)
            raise
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await self._abort(method.__name__, context, exc)
        self._count(method.__name__, grpc.StatusCode.OK)

    return handler


_ENTRY_TYPES = {
    EntryType.FILE: hub_pb2.ENTRY_TYPE_FILE,
    EntryType.DIRECTORY: hub_pb2.ENTRY_TYPE_DIRECTORY,
    EntryType.SYMLINK: hub_pb2.ENTRY_TYPE_SYMLINK,
}


def _snapshot_message(snapshot: Snapshot) -> hub_pb2.Snapshot:
    return hub_pb2.Snapshot(
        dataset=snapshot.dataset,
        version=snapshot.version,
        snapshot_id=snapshot.snapshot_id,
        created_ns=snapshot.created_ns,
        block_size=snapshot.block_size,
        file_count=snapshot.file_count,
        total_bytes=snapshot.total_bytes,
    )


def _tag_message(tag: Tag) -> hub_pb2.Tag:
    return hub_pb2.Tag(name=tag.name, version=tag.version)


def _entry_message(entry: ManifestEntry) -> hub_pb2.ManifestEntry:
    return hub_pb2.ManifestEntry(
        path=entry.path,
        type=_ENTRY_TYPES[entry.type],
        mode=entry.mode,
        size=entry.size,
        mtime_ns=entry.mtime_ns,
        symlink_target=entry.symlink_target,
        blocks=[hub_pb2.BlockRef(digest=block.digest, size=block.size) for block in entry.blocks],
    )


class HubService(hub_pb2_grpc.HubServicer):
    """Implements ``protocol.hub.v1.Hub`` over a catalog and a blob store.

    Args:
        catalog: The catalog to serve; read only.
        store: Where the blocks are.
        metrics: Counters to update; a private set by default.
        chunk_bytes: Largest ``BlockChunk.data``, bytes.
    """

    def __init__(
        self,
        catalog: Catalog,
        store: BlobStore,
        metrics: HubMetrics | None = None,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
        self._catalog = catalog
        self._store = store
        self._metrics = metrics if metrics is not None else HubMetrics()
        self._chunk_bytes = chunk_bytes

    def _count(self, method: str, code: grpc.StatusCode) -> None:
        self._metrics.requests.labels(method=method, code=code.name).inc()

    async def _abort(self, method: str, context: Any, error: Exception) -> NoReturn:
        """Ends the call with the status for ``error``; the one place errors become statuses."""
        if isinstance(error, HubError):
            code, details = status_code(error), str(error)
        else:
            logger.exception("%s failed", method, exc_info=error)
            code, details = grpc.StatusCode.INTERNAL, f"internal error in {method}"
        self._count(method, code)
        await context.abort(code, details)
        raise AssertionError("context.abort() returned")  # it always raises

    @_unary
    async def ListDatasets(
        self, request: hub_pb2.ListDatasetsRequest, context: Any
    ) -> hub_pb2.ListDatasetsResponse:
        """Lists every dataset, in name order."""
        datasets = await asyncio.to_thread(self._catalog.list_datasets)
        return hub_pb2.ListDatasetsResponse(
            datasets=[
                hub_pb2.Dataset(
                    name=dataset.name,
                    version_count=dataset.version_count,
                    latest_version=dataset.latest_version,
                )
                for dataset in datasets
            ]
        )

    @_unary
    async def ListVersions(
        self, request: hub_pb2.ListVersionsRequest, context: Any
    ) -> hub_pb2.ListVersionsResponse:
        """Lists a dataset's versions (oldest first) and tags; NOT_FOUND for an unknown one."""

        def read() -> tuple[list[Snapshot], list[Tag]]:
            return (
                self._catalog.list_versions(request.dataset),
                self._catalog.list_tags(request.dataset),
            )

        versions, tags = await asyncio.to_thread(read)
        return hub_pb2.ListVersionsResponse(
            versions=[_snapshot_message(snapshot) for snapshot in versions],
            tags=[_tag_message(tag) for tag in tags],
        )

    @_unary
    async def ResolveRef(
        self, request: hub_pb2.ResolveRefRequest, context: Any
    ) -> hub_pb2.Snapshot:
        """Resolves a version or tag to its snapshot."""
        snapshot = await asyncio.to_thread(self._catalog.resolve, request.dataset, request.ref)
        return _snapshot_message(snapshot)

    @_streaming
    async def GetManifest(
        self, request: hub_pb2.GetManifestRequest, context: Any
    ) -> AsyncIterator[hub_pb2.ManifestEntry]:
        """Streams a snapshot's manifest in path order, one catalog page at a time."""
        snapshot = await asyncio.to_thread(self._catalog.resolve, request.dataset, request.ref)
        start = 0
        while True:
            page = await asyncio.to_thread(
                self._catalog.manifest_page, snapshot.snapshot_id, start, MANIFEST_PAGE_ENTRIES
            )
            for entry in page:
                yield _entry_message(entry)
            if len(page) < MANIFEST_PAGE_ENTRIES:
                return
            start += len(page)

    @_streaming
    async def ReadBlocks(
        self, request_iterator: AsyncIterator[hub_pb2.ReadBlocksRequest], context: Any
    ) -> AsyncIterator[hub_pb2.BlockChunk]:
        """Answers each requested digest, in order, with its bytes in chunks."""
        async for request in request_iterator:
            digests = [validate_digest(digest) for digest in request.digests]
            for digest in digests:
                async for chunk in self._block_chunks(digest):
                    yield chunk

    async def _block_chunks(self, digest: str) -> AsyncIterator[hub_pb2.BlockChunk]:
        size = await asyncio.to_thread(self._store.size, digest)
        offset = 0
        while True:
            length = min(self._chunk_bytes, size - offset)
            data = await asyncio.to_thread(self._store.read, digest, offset, length)
            if len(data) != length:
                raise CorruptBlob(f"block {digest} is shorter than its {size} bytes")
            last = offset + length >= size
            yield hub_pb2.BlockChunk(
                digest=digest, offset=offset, data=data, block_size=size, last=last
            )
            self._metrics.blocks_served_bytes.inc(length)
            offset += length
            if last:
                self._metrics.blocks_served.inc()
                return
