"""The daemon's local gRPC service (SpokeLocal) for the mount process, on a UNIX socket.

Domain errors are mapped to gRPC status codes here and nowhere else. Every read the mount
reports (a hit in ``RecordAccess``, a miss in ``EnsureBlocks``) goes to the access log,
whose subscribers (policy, hints, ledger, fill) take it from there; misses are then
fetched as demand, the mount's readahead (in-file and cross-file, each its own source in
the prefetch ledger) as readahead.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
import grpc.aio

from protocol.hub.v1 import hub_pb2
from protocol.spoke.v1 import spoke_pb2, spoke_pb2_grpc
from spoke import metrics
from spoke.cache.blockcache import BlockCache
from spoke.catalog.catalog import SnapshotCatalog
from spoke.catalog.snapshots import SnapshotIndex
from spoke.disk.layout import is_digest
from spoke.errors import (
    AccessDenied,
    CorruptBlock,
    CorruptManifest,
    HubUnavailable,
    InvalidRequest,
    MissDeadline,
    NotFound,
    SpokeError,
)
from spoke.fetch.priority import Source
from spoke.fetch.scheduler import FetchScheduler, Priority
from spoke.prefetch.hints import HintService
from spoke.serve.access import AccessLog
from strata_local.memory import trim_malloc

log = logging.getLogger(__name__)

T = TypeVar("T")

MANIFEST_PAGE_ENTRIES = 2048  # most entries per ManifestPage message
MANIFEST_PAGE_BYTES = 1 << 20  # a page closes once its entries reach this size

_CODES: dict[type[SpokeError], grpc.StatusCode] = {  # first match wins: subclasses first
    MissDeadline: grpc.StatusCode.DEADLINE_EXCEEDED,
    NotFound: grpc.StatusCode.NOT_FOUND,
    InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    HubUnavailable: grpc.StatusCode.UNAVAILABLE,
    CorruptBlock: grpc.StatusCode.DATA_LOSS,
    CorruptManifest: grpc.StatusCode.DATA_LOSS,
    AccessDenied: grpc.StatusCode.PERMISSION_DENIED,
}


_SOURCES = {
    spoke_pb2.PREFETCH_SOURCE_UNSPECIFIED: Source.READAHEAD,
    spoke_pb2.PREFETCH_SOURCE_READAHEAD: Source.READAHEAD,
    spoke_pb2.PREFETCH_SOURCE_CROSSFILE: Source.CROSSFILE,
}


def _status_for(err: SpokeError) -> grpc.StatusCode:
    for kind, code in _CODES.items():
        if isinstance(err, kind):
            return code
    return grpc.StatusCode.INTERNAL


def _unary(
    fn: Callable[..., Awaitable[T]],
) -> Callable[..., Awaitable[T]]:
    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> T:
        try:
            return await fn(self, request, context)
        except SpokeError as err:
            await context.abort(_status_for(err), str(err))
            raise  # unreachable: abort raises

    return wrapper


class SpokeLocalService(spoke_pb2_grpc.SpokeLocalServicer):  # type: ignore[misc]
    """Serves the catalog, misses and access records to the mount.

    Args:
        catalog: datasets, versions, manifests.
        cache: the block cache (suspect blocks are re-verified here).
        scheduler: fetches misses (demand) and the mount's readahead.
        access: where reads are recorded.
        hints: while a reader waits for a block, its hint stream must not evict it.
        index: manifests the mount loads are indexed here (background fill).
    """

    def __init__(
        self,
        catalog: SnapshotCatalog,
        cache: BlockCache,
        scheduler: FetchScheduler,
        access: AccessLog,
        hints: HintService | None = None,
        index: SnapshotIndex | None = None,
    ) -> None:
        self._catalog = catalog
        self._cache = cache
        self._scheduler = scheduler
        self._access = access
        self._hints = hints
        self._index = index

    @_unary
    async def ListDatasets(
        self, request: hub_pb2.ListDatasetsRequest, context: grpc.aio.ServicerContext
    ) -> hub_pb2.ListDatasetsResponse:
        return await self._catalog.list_datasets(stale_ok=True)

    @_unary
    async def ListVersions(
        self, request: hub_pb2.ListVersionsRequest, context: grpc.aio.ServicerContext
    ) -> hub_pb2.ListVersionsResponse:
        return await self._catalog.list_versions(request.dataset, stale_ok=True)

    @_unary
    async def ResolveRef(
        self, request: hub_pb2.ResolveRefRequest, context: grpc.aio.ServicerContext
    ) -> hub_pb2.Snapshot:
        return await self._catalog.resolve_ref(request.dataset, request.ref, stale_ok=True)

    async def GetManifest(
        self, request: hub_pb2.GetManifestRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[spoke_pb2.ManifestPage]:
        try:
            entries = await self._catalog.manifest(request.dataset, request.ref, stale_ok=True)
        except SpokeError as err:
            await context.abort(_status_for(err), str(err))
            return
        if self._index is not None:
            self._index.learn(f"{request.dataset}@{request.ref}", entries)
        page: list[hub_pb2.ManifestEntry] = []
        size = 0
        for entry in entries:
            page.append(entry)
            size += entry.ByteSize()
            if len(page) >= MANIFEST_PAGE_ENTRIES or size >= MANIFEST_PAGE_BYTES:
                yield spoke_pb2.ManifestPage(entries=page)
                page, size = [], 0
        if page:
            yield spoke_pb2.ManifestPage(entries=page)
        # the manifest's messages were freed between pages still in use: give the pages
        # back (without this, a 100,000-file snapshot left the daemon ~250 B a file larger)
        del entries, page
        await asyncio.to_thread(trim_malloc)

    @_unary
    async def EnsureBlocks(
        self, request: spoke_pb2.EnsureBlocksRequest, context: grpc.aio.ServicerContext
    ) -> spoke_pb2.EnsureBlocksResponse:
        refs = [(b.digest, b.size) for b in request.blocks]
        bad = [d for d in [*(d for d, _ in refs), *request.suspect_digests] if not is_digest(d)]
        if bad:
            raise InvalidRequest(f"malformed block digest {bad[0]!r}")
        for digest in request.suspect_digests:
            if self._cache.contains(digest) and not self._cache.store.verify(digest):
                log.error("cached block %s failed verification; dropping and refetching", digest)
                metrics.CORRUPT_BLOCKS.inc()
                self._cache.drop(digest)
        digests = [d for d, _ in refs]
        self._cache.confirm_resident(digests)  # the mount asks for what it could not read
        if self._hints is not None:
            self._hints.hold(digests)
        try:
            # recorded before the fetch, so hints and readahead move on at once
            for hit, run in itertools.groupby(digests, key=self._cache.contains):
                self._access.record(list(run), hit)
            was_cached, uncached = await self._scheduler.ensure(refs, Priority.DEMAND)
        finally:
            if self._hints is not None:
                self._hints.release(digests)
        return spoke_pb2.EnsureBlocksResponse(
            prompt=self._prompt(),
            was_cached=was_cached,
            uncached=[spoke_pb2.UncachedBlock(digest=d, data=b) for d, b in uncached.items()],
        )

    @_unary
    async def RecordAccess(
        self, request: spoke_pb2.RecordAccessRequest, context: grpc.aio.ServicerContext
    ) -> spoke_pb2.RecordAccessResponse:
        if request.digests:
            self._access.record(list(request.digests), True)
        if request.read_errors:
            metrics.READ_ERRORS.inc(request.read_errors)
        return spoke_pb2.RecordAccessResponse(prompt=self._prompt())

    @_unary
    async def Prefetch(
        self, request: spoke_pb2.PrefetchRequest, context: grpc.aio.ServicerContext
    ) -> spoke_pb2.PrefetchResponse:
        refs = [(b.digest, b.size) for b in request.blocks]
        bad = [d for d, _ in refs if not is_digest(d)]
        if bad:
            raise InvalidRequest(f"malformed block digest {bad[0]!r}")
        self._cache.confirm_resident(d for d, _ in refs)  # the mount found these missing
        source = _SOURCES.get(request.source)
        if source is None:
            raise InvalidRequest(f"unknown prefetch source {request.source}")
        started = self._scheduler.prefetch(refs, Priority.READAHEAD, source)
        return spoke_pb2.PrefetchResponse(
            started=started, room_bytes=self._scheduler.readahead_room(source)
        )

    def _prompt(self) -> bool:
        return self._hints is not None and self._hints.policy.active
