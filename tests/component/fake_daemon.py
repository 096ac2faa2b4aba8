"""A fake spoke daemon for the mount's component tests (no gRPC, no kernel).

The catalog is one dataset ``ds`` with version ``v1`` (tag ``latest``) holding ``dir/f.bin``
made of the given blocks; a miss is "fetched" by writing the block file. ``resident``
models the daemon's index: a block it believes on disk is not written again unless the
mount names it suspect (then it is re-verified and rewritten, as the real daemon does).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from protocol.hub.v1 import hub_pb2
from spoke.disk.layout import CacheLayout, block_digest


class FakeDaemon:
    """Catalog from memory; misses are 'fetched' by writing the block file."""

    def __init__(self, layout: CacheLayout, blocks: dict[str, bytes]) -> None:
        self.layout = layout
        self.blocks = blocks
        self.ensured: list[str] = []
        self.suspects: list[str] = []
        self.fail_catalog = False
        self.prompt = False  # as DaemonClient.prompt
        self.readahead_room: dict[int, int] = {}  # as DaemonClient.readahead_room
        self.miss_deadline = 5.0
        self.resident: set[str] = set()  # what the daemon's index says is on disk
        self.versions = ["v1"]
        self.reports: list[list[str]] = []
        self.read_errors = 0  # reads answered EIO, as the hit reports tell them
        self.prefetched: list[tuple[list[tuple[str, int]], int]] = []  # blocks, source

    def list_datasets(self) -> list[str]:
        return ["ds"]

    def list_versions(self, dataset: str) -> hub_pb2.ListVersionsResponse:
        if self.fail_catalog:
            raise RuntimeError("boom")
        return hub_pb2.ListVersionsResponse(
            versions=[
                hub_pb2.Snapshot(dataset="ds", version=v, snapshot_id=f"s{v}")
                for v in self.versions
            ],
            tags=[hub_pb2.Tag(name="latest", version=self.versions[-1])],
        )

    def manifest(self, dataset: str, version: str) -> list[hub_pb2.ManifestEntry]:
        refs = [hub_pb2.BlockRef(digest=d, size=len(b)) for d, b in self.blocks.items()]
        return [
            hub_pb2.ManifestEntry(path="dir", type=hub_pb2.ENTRY_TYPE_DIRECTORY, mode=0o755),
            hub_pb2.ManifestEntry(
                path="dir/f.bin",
                type=hub_pb2.ENTRY_TYPE_FILE,
                mode=0o644,
                size=sum(len(b) for b in self.blocks.values()),
                blocks=refs,
            ),
        ]

    def ensure_blocks(
        self, blocks: Sequence[tuple[str, int]], suspect: Sequence[str], timeout: float
    ) -> dict[str, bytes]:
        self.suspects.extend(suspect)
        for digest, _ in blocks:
            self.ensured.append(digest)
            path = self.layout.block_path(digest)
            if digest in suspect and not _valid(path, digest):
                self.resident.discard(digest)  # re-verified: dropped, fetched again
                if path.is_dir():
                    shutil.rmtree(path)
                path.unlink(missing_ok=True)
            if digest in self.resident:
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(self.blocks[digest])
            self.resident.add(digest)
        return {}

    def record_access(self, digests: Sequence[str], read_errors: int = 0) -> None:
        if digests:
            self.reports.append(list(digests))
        self.read_errors += read_errors

    def prefetch(self, blocks: Sequence[tuple[str, int]], source: int = 1) -> int:
        self.prefetched.append((list(blocks), source))
        return 0


def _valid(path: Path, digest: str) -> bool:
    try:
        return block_digest(path.read_bytes()) == digest
    except OSError:
        return False
