"""Blocking client of the spoke daemon's local gRPC service (SpokeLocal, UNIX socket).

Every call runs in a worker thread of the mount (never on its trio loop). Catalog and
miss calls use ``wait_for_ready``, so while the daemon restarts they wait for it instead
of failing, up to their deadline; hit reports and prefetches never wait.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import grpc

from protocol.hub.v1 import hub_pb2
from protocol.spoke.v1 import spoke_pb2, spoke_pb2_grpc

MANIFEST_TIMEOUT = 600.0
"""Longest wait for a whole manifest, seconds. The daemon bounds its own call to the hub;
what it does after the first fetch of a million-entry manifest (check, store, page out)
took it over a minute on a loaded 2-core VM, and the 60 s this was failed the first
listing of a 1,000,000-file snapshot with EIO (``bench.small_files --scale``)."""


class DaemonClient:
    """The mount's connection to its daemon.

    Args:
        socket_path: the daemon's UNIX socket.
        miss_deadline: longest wait for a miss, seconds (then the read fails with EIO).
        catalog_timeout: longest wait for a catalog answer, seconds.
    """

    def __init__(
        self, socket_path: Path, miss_deadline: float = 60.0, catalog_timeout: float = 10.0
    ) -> None:
        self.miss_deadline = miss_deadline
        self.catalog_timeout = catalog_timeout
        self.prompt = False  # the daemon's last word: report hits as they happen
        # the daemon's last word on how much more readahead each source may ask for
        self.readahead_room: dict[int, int] = {}
        self._channel = grpc.insecure_channel(
            f"unix:{socket_path}",
            options=[
                ("grpc.max_receive_message_length", 256 << 20),
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 1000),
            ],
        )
        self._stub = spoke_pb2_grpc.SpokeLocalStub(self._channel)

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def list_datasets(self) -> list[str]:
        """Dataset names. Raises grpc.RpcError."""
        reply = self._stub.ListDatasets(
            hub_pb2.ListDatasetsRequest(), timeout=self.catalog_timeout, wait_for_ready=True
        )
        return [d.name for d in reply.datasets]

    def list_versions(self, dataset: str) -> hub_pb2.ListVersionsResponse:
        """A dataset's versions and tags. Raises grpc.RpcError (NOT_FOUND, UNAVAILABLE, …)."""
        reply: hub_pb2.ListVersionsResponse = self._stub.ListVersions(
            hub_pb2.ListVersionsRequest(dataset=dataset),
            timeout=self.catalog_timeout,
            wait_for_ready=True,
        )
        return reply

    def manifest(self, dataset: str, version: str) -> Iterator[hub_pb2.ManifestEntry]:
        """A snapshot's manifest entries in path order, read a page at a time as they are
        iterated (in the caller's thread). Raises grpc.RpcError."""
        stream = self._stub.GetManifest(
            hub_pb2.GetManifestRequest(dataset=dataset, ref=version),
            timeout=max(self.catalog_timeout * 6, MANIFEST_TIMEOUT),
            wait_for_ready=True,
        )
        for page in stream:
            yield from page.entries

    def ensure_blocks(
        self, blocks: Sequence[tuple[str, int]], suspect: Sequence[str], timeout: float
    ) -> dict[str, bytes]:
        """Block until the daemon has every ``(digest, size)`` on disk (one call).

        The call waits for a restarting daemon (``wait_for_ready``) up to ``timeout``; the
        retries around it live in :class:`fusemount.source.BlockSource`.

        Args:
            blocks: the blocks wanted.
            suspect: digests whose cached file failed verification or could not be read here.
            timeout: seconds this call may take.

        Returns:
            The bytes of blocks the daemon could not cache (streamed through), by digest.

        Raises:
            grpc.RpcError: DEADLINE_EXCEEDED after ``timeout``, UNAVAILABLE when the daemon
                went away mid-call or the hub cannot deliver, NOT_FOUND when it lacks a block.
        """
        request = spoke_pb2.EnsureBlocksRequest(
            blocks=[hub_pb2.BlockRef(digest=d, size=s) for d, s in blocks],
            suspect_digests=list(suspect),
        )
        reply = self._stub.EnsureBlocks(request, timeout=timeout, wait_for_ready=True)
        self.prompt = bool(reply.prompt)
        return {u.digest: u.data for u in reply.uncached}

    def prefetch(
        self,
        blocks: Sequence[tuple[str, int]],
        source: int = spoke_pb2.PREFETCH_SOURCE_READAHEAD,
    ) -> int:
        """Ask the daemon to fetch blocks ahead of reads for ``source`` (a
        ``spoke_pb2.PrefetchSource``: in-file or cross-file readahead); returns how many
        it started.

        Best effort: a short deadline, never waits for a restarting daemon. Updates
        :attr:`readahead_room` from the answer.
        """
        reply = self._stub.Prefetch(
            spoke_pb2.PrefetchRequest(
                blocks=[hub_pb2.BlockRef(digest=d, size=s) for d, s in blocks],
                source=source,  # type: ignore[arg-type]
            ),
            timeout=2.0,
        )
        if reply.HasField("room_bytes"):
            self.readahead_room[source] = reply.room_bytes
        return int(reply.started)

    def record_access(self, digests: Sequence[str], read_errors: int = 0) -> None:
        """Report a batch of hits, and the reads answered with EIO since the last report
        (best effort: a short deadline, never waits for a restart).

        Updates :attr:`prompt`, whether the daemon wants hits reported as they happen (a
        read-order hint is installed), as every EnsureBlocks answer does.
        """
        reply = self._stub.RecordAccess(
            spoke_pb2.RecordAccessRequest(digests=list(digests), read_errors=read_errors),
            timeout=2.0,
        )
        self.prompt = bool(reply.prompt)
