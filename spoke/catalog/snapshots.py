"""Which snapshots the mount has loaded, and which blocks each holds.

The daemon sees reads only as block digests. Background fill needs "block → snapshot"
and each snapshot's blocks in manifest order; both come from the manifests the mount
loads (``GetManifest``), kept here in a small LRU.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from protocol.hub.v1 import hub_pb2
from spoke.catalog.digests import DigestSizes

MAX_SNAPSHOTS = 8
"""Snapshots indexed at once (the least recently loaded one is dropped)."""


@dataclass(eq=False)
class IndexedSnapshot:
    """One snapshot's distinct blocks.

    Attributes:
        key: ``dataset@version`` as loaded.
        sizes: digest → size (bytes) of every distinct block of its regular files, in
            manifest (path) order of first use (:class:`~spoke.catalog.digests.DigestSizes`:
            about 30 bytes a block).
    """

    key: str
    sizes: DigestSizes = field(default_factory=DigestSizes)

    @property
    def total_bytes(self) -> int:
        """Bytes of the snapshot's distinct blocks."""
        return self.sizes.total()


class SnapshotIndex:
    """The loaded snapshots, by key; looked up by digest."""

    def __init__(self, max_snapshots: int = MAX_SNAPSHOTS) -> None:
        self.max_snapshots = max_snapshots
        self._snapshots: OrderedDict[str, IndexedSnapshot] = OrderedDict()

    def learn(self, key: str, entries: Iterable[hub_pb2.ManifestEntry]) -> IndexedSnapshot:
        """Index a manifest under ``key`` (``dataset@version``; again: refreshed as recent)."""
        known = self._snapshots.get(key)
        if known is not None:
            self._snapshots.move_to_end(key)
            return known
        snap = IndexedSnapshot(key)
        add = snap.sizes.add
        for entry in entries:
            if entry.type == hub_pb2.ENTRY_TYPE_FILE:
                for b in entry.blocks:
                    add(b.digest, b.size)
        self._snapshots[key] = snap
        while len(self._snapshots) > self.max_snapshots:
            self._snapshots.popitem(last=False)
        return snap

    def get(self, key: str) -> IndexedSnapshot | None:
        """A snapshot by key."""
        return self._snapshots.get(key)

    def lookup(self, digest: str) -> list[IndexedSnapshot]:
        """Every indexed snapshot holding ``digest``."""
        return [s for s in self._snapshots.values() if digest in s.sizes]

    def __len__(self) -> int:
        return len(self._snapshots)
