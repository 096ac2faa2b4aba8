"""Which snapshots the mount has loaded, and where each block sits in them.

The daemon sees reads only as block digests. Cross-file readahead needs "block → file
position in manifest order" and background fill needs "block → snapshot"; both come from
the manifests the mount loads (``GetManifest``), kept here in a small LRU.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from protocol.hub.v1 import hub_pb2

MAX_SNAPSHOTS = 8
"""Snapshots indexed at once (the least recently loaded one is dropped)."""

MAX_POSITIONS = 4
"""Positions remembered per digest and snapshot (a block shared by many files, such as
an all-zero chunk, says nothing useful about which file is read)."""


@dataclass(eq=False)
class IndexedSnapshot:
    """One snapshot's regular files with data, in manifest (path) order.

    Attributes:
        key: ``dataset@version`` as loaded.
        files: per position, the file's ``(digest, size)`` blocks.
        positions: digest → positions of the files holding it (at most
            :data:`MAX_POSITIONS`).
        sizes: digest → size of every distinct block.
    """

    key: str
    files: list[list[tuple[str, int]]]
    positions: dict[str, list[int]] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        """Bytes of the snapshot's distinct blocks."""
        return sum(self.sizes.values())


class SnapshotIndex:
    """The loaded snapshots, by key; looked up by digest."""

    def __init__(self, max_snapshots: int = MAX_SNAPSHOTS) -> None:
        self.max_snapshots = max_snapshots
        self._snapshots: OrderedDict[str, IndexedSnapshot] = OrderedDict()

    def learn(self, key: str, entries: Sequence[hub_pb2.ManifestEntry]) -> IndexedSnapshot:
        """Index a manifest under ``key`` (``dataset@version``; again: refreshed as recent)."""
        known = self._snapshots.get(key)
        if known is not None:
            self._snapshots.move_to_end(key)
            return known
        files = [
            [(b.digest, b.size) for b in e.blocks]
            for e in entries
            if e.type == hub_pb2.ENTRY_TYPE_FILE and len(e.blocks) > 0
        ]
        snap = IndexedSnapshot(key, files)
        for position, blocks in enumerate(files):
            for digest, size in blocks:
                snap.sizes[digest] = size
                where = snap.positions.setdefault(digest, [])
                if len(where) < MAX_POSITIONS and (not where or where[-1] != position):
                    where.append(position)
        self._snapshots[key] = snap
        while len(self._snapshots) > self.max_snapshots:
            self._snapshots.popitem(last=False)
        return snap

    def get(self, key: str) -> IndexedSnapshot | None:
        """A snapshot by key."""
        return self._snapshots.get(key)

    def lookup(self, digest: str) -> list[tuple[IndexedSnapshot, list[int]]]:
        """Every indexed snapshot holding ``digest``, with the positions of its files."""
        return [(s, s.positions[digest]) for s in self._snapshots.values() if digest in s.positions]

    def __len__(self) -> int:
        return len(self._snapshots)
