"""A snapshot whose entries the inode table (:mod:`fusemount.tree`) holds as columns,
and its files as a sequence of nodes made on demand."""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, overload

from fusemount.entries import SnapshotEntries

if TYPE_CHECKING:
    from fusemount.tree import Node


@dataclass(slots=True, eq=False)
class LoadedSnapshot:
    """A snapshot whose entries the table holds.

    Attributes:
        snapshot_id: its content digest.
        first: the inode of entry 1 (its range is ``first .. first + count - 1``).
        entries: its columns (:class:`~fusemount.entries.SnapshotEntries`).
        dataset, version: the version it was first loaded as (its nodes show these).
        refs: the kernel's lookup count of each entry, by index (u64; index 0 unused).
        held: how many entries the kernel holds a reference to.
        idle_since: since when none is held (monotonic seconds).
    """

    snapshot_id: str
    first: int
    entries: SnapshotEntries
    dataset: str
    version: str
    refs: array[int]
    held: int = 0
    idle_since: float = 0.0

    @property
    def count(self) -> int:
        """Entries in the snapshot."""
        return self.entries.count


class SnapshotFiles(Sequence["Node"]):
    """A loaded snapshot's files with data in manifest order, as nodes made on demand."""

    __slots__ = ("_loaded", "_make")

    def __init__(self, make: Callable[[LoadedSnapshot, int], Node], loaded: LoadedSnapshot) -> None:
        self._make, self._loaded = make, loaded

    @overload
    def __getitem__(self, k: int) -> Node: ...
    @overload
    def __getitem__(self, k: slice) -> Sequence[Node]: ...
    def __getitem__(self, k: int | slice) -> Node | Sequence[Node]:
        if isinstance(k, slice):
            return [self[j] for j in range(*k.indices(len(self)))]
        return self._make(self._loaded, self._loaded.entries.files[k])

    def __len__(self) -> int:
        return len(self._loaded.entries.files)
