"""A loaded snapshot's entries as columns of numbers and bytes, not one object per file.

A snapshot of a million files kept one :class:`~fusemount.tree.Node` per file (with its
blocks tuple, hex digests, name keys and listing dicts): about 1 KiB of the mount's memory
per file. :class:`SnapshotEntries` keeps the same facts in a few flat arrays (about 90
bytes per one-block file; see ``DESIGN.md``, "Loaded snapshots"); the inode table makes a
``Node`` of an entry only when a request names it (:meth:`fusemount.tree.InodeTable.get`).

Entries are numbered in the order :meth:`SnapshotEntries.build` makes them (manifest order,
an implicit parent directory just before its first child), from 1; index 0 is the
snapshot's root (the version directory, which is not an entry). Entry ``i`` has inode
``first + i - 1``, where ``first`` is its snapshot's range in the inode table.
"""

from __future__ import annotations

import itertools
import stat
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Final, overload

from protocol.hub.v1 import hub_pb2

DIGEST_BYTES: Final = 16
"""A block digest's raw length (32 lowercase hex characters in the manifest)."""

_TYPE_BITS: Final = {
    hub_pb2.ENTRY_TYPE_FILE: stat.S_IFREG,
    hub_pb2.ENTRY_TYPE_DIRECTORY: stat.S_IFDIR,
    hub_pb2.ENTRY_TYPE_SYMLINK: stat.S_IFLNK,
}
_U32_MAX: Final = (1 << 32) - 1

Block = tuple[str, int]
"""A block as the reader uses it: ``(digest, size in bytes)``."""


class SnapshotEntries:
    """One snapshot's entries: modes, sizes, times, names, blocks and listings in arrays.

    Index ``i`` (0 = the snapshot's root, 1..:attr:`count` the entries) addresses every
    column. Columns (one value per index unless said otherwise):

    - ``modes`` (u32): full ``st_mode``; ``sizes`` (u64): bytes; ``mtimes`` (i64): ns;
      ``nlinks`` (u32): 1, or 2 + subdirectories for a directory;
    - ``name_ends`` (u32) into ``names`` (bytes): the entry's last path component, UTF-8;
    - ``block_ends`` (u32) into ``digests`` (16 raw bytes a block) and ``block_sizes``
      (u32 a block): the file's blocks in file order;
    - ``kid_ends`` (u32) into ``kids`` (u32 a child): a directory's children, as indexes,
      sorted by name (bytes), so a lookup is a binary search and readdir offsets stable;
    - ``positions`` (i32): a file with data, its index in ``files`` (u32 a file: the
      indexes of the files with data in manifest order); -1 for anything else.

    Rare facts stay in dicts: symlink targets, and the blocks of a file whose digests are
    not 32 lowercase hex characters (kept as given, so every byte handed out is the
    manifest's).
    """

    def __init__(self) -> None:
        self.modes = array("I", [stat.S_IFDIR | 0o555])
        self.sizes = array("Q", [0])
        self.mtimes = array("q", [0])
        self.nlinks = array("I", [1])
        self.names = bytearray()
        self.name_ends = array("I", [0])
        self.digests = bytearray()
        self.block_sizes = array("I")
        self.block_ends = array("I", [0])
        self.kids = array("I")
        self.kid_ends = array("I", [0])
        self.positions = array("i", [-1])
        self.files = array("I")
        self.targets: dict[int, bytes] = {}
        self.odd_blocks: dict[int, tuple[Block, ...]] = {}

    @property
    def count(self) -> int:
        """Entries (the root not counted): the size of the snapshot's inode range."""
        return len(self.modes) - 1

    @classmethod
    def build(cls, entries: Iterable[hub_pb2.ManifestEntry]) -> SnapshotEntries:
        """The columns of a manifest, read once in its (path) order; ``entries`` may be a
        generator over the daemon's pages, so no more than a page is held at a time.

        A parent directory missing from the manifest is made just before its first child
        (mode 0o555); an entry whose path is already a directory is skipped; a name given
        twice in a directory lists the later entry (both are numbered), as the mount's
        dict-based tree did.

        Raises:
            ValueError: over 2**32 - 1 entries, blocks or name bytes.
        """
        out = cls()
        dirs: dict[str, int] = {"": 0}
        children: dict[int, array[int]] = {0: array("I")}
        for entry in entries:
            if entry.path not in dirs:
                out._add(entry, dirs, children)
        out._link(children)
        return out

    def _add(
        self,
        entry: hub_pb2.ManifestEntry,
        dirs: dict[str, int],
        children: dict[int, array[int]],
    ) -> None:
        path = entry.path
        head, _, name = path.rpartition("/")
        parent = dirs.get(head)
        if parent is None:
            implicit = hub_pb2.ManifestEntry(
                path=head, type=hub_pb2.ENTRY_TYPE_DIRECTORY, mode=0o555
            )
            self._add(implicit, dirs, children)
            parent = dirs[head]
        i = len(self.modes)
        mode = _TYPE_BITS.get(entry.type, stat.S_IFREG) | (entry.mode & 0o7777)
        self.modes.append(mode)
        self.sizes.append(entry.size)
        self.mtimes.append(entry.mtime_ns)
        self.nlinks.append(1)
        self.names += name.encode()
        self.name_ends.append(_u32(len(self.names), "name bytes"))
        if entry.symlink_target:
            self.targets[i] = entry.symlink_target.encode()
        blocks = entry.blocks
        if blocks:
            try:
                raw = b"".join(_raw(b.digest) for b in blocks)
            except ValueError:
                self.odd_blocks[i] = tuple((b.digest, b.size) for b in blocks)
            else:
                self.digests += raw
                self.block_sizes.extend(b.size for b in blocks)
        self.block_ends.append(_u32(len(self.block_sizes), "blocks"))
        if stat.S_ISREG(mode) and blocks:
            self.positions.append(len(self.files))
            self.files.append(i)
        else:
            self.positions.append(-1)
        children[parent].append(i)
        if stat.S_ISDIR(mode):
            dirs[path] = i
            children[i] = array("I")

    def _link(self, children: dict[int, array[int]]) -> None:
        """Lay out every directory's children sorted by name (later duplicates win) and
        count subdirectories into ``nlinks``."""
        for i in range(len(self.modes)):
            kids = children.pop(i, None)
            if kids:
                kids = self._sorted(kids)
                self.kids += kids
                if i:
                    self.nlinks[i] = 2 + sum(stat.S_ISDIR(self.modes[k]) for k in kids)
            elif kids is not None and i:
                self.nlinks[i] = 2
            self.kid_ends.append(_u32(len(self.kids), "children"))

    def _sorted(self, kids: array[int]) -> array[int]:
        name = self.name
        ordered = all(name(a) < name(b) for a, b in itertools.pairwise(kids))
        if ordered:  # the usual case: path order is name order
            return kids
        by_name: dict[bytes, int] = {}
        for k in kids:  # a later entry of the same name replaces the earlier one
            by_name[name(k)] = k
        return array("I", (by_name[n] for n in sorted(by_name)))

    # -- reading ---------------------------------------------------------------------------

    def name(self, i: int) -> bytes:
        """Entry ``i``'s last path component (UTF-8 bytes; empty for the root)."""
        return bytes(self.names[self.name_ends[i - 1] if i else 0 : self.name_ends[i]])

    def blocks(self, i: int) -> tuple[Block, ...]:
        """Entry ``i``'s blocks in file order, ``(digest, size)`` (empty but for files)."""
        odd = self.odd_blocks.get(i) if self.odd_blocks else None
        if odd is not None:
            return odd
        start, end = self.block_ends[i - 1] if i else 0, self.block_ends[i]
        raw, sizes = self.digests, self.block_sizes
        if end - start == 1:  # the usual small file
            return ((raw[start * DIGEST_BYTES : end * DIGEST_BYTES].hex(), sizes[start]),)
        return tuple(
            (raw[b * DIGEST_BYTES : (b + 1) * DIGEST_BYTES].hex(), sizes[b])
            for b in range(start, end)
        )

    def target(self, i: int) -> bytes:
        """Entry ``i``'s symlink target (empty for anything else)."""
        return self.targets.get(i, b"")

    def listing(self, i: int, first: int) -> Listing:
        """Directory ``i``'s children, name → inode, for a snapshot range starting at
        ``first``."""
        return Listing(self, i, first)

    def child_count(self, i: int) -> int:
        """How many children directory ``i`` lists (0 for anything else)."""
        return self.kid_ends[i + 1] - self.kid_ends[i]


class Listing(Mapping[bytes, int]):
    """One directory's children, name (bytes) → inode, sorted by name; a view of the
    columns (nothing is copied). :attr:`names` is the sorted names as a sequence, the
    offsets readdir hands out."""

    __slots__ = ("_base", "_end", "_entries", "_start", "names")

    def __init__(self, entries: SnapshotEntries, index: int, first: int) -> None:
        self._entries = entries
        self._start = entries.kid_ends[index]
        self._end = entries.kid_ends[index + 1]
        self._base = first - 1  # entry i has inode first + i - 1
        self.names: Sequence[bytes] = _Names(entries, self._start, self._end)

    def _find(self, name: bytes) -> int:
        """The child index named ``name``, or -1."""
        entries, lo, hi = self._entries, self._start, self._end
        kids = entries.kids
        while lo < hi:
            mid = (lo + hi) // 2
            got = entries.name(kids[mid])
            if got < name:
                lo = mid + 1
            elif got > name:
                hi = mid
            else:
                return kids[mid]
        return -1

    def __getitem__(self, name: bytes) -> int:
        found = self._find(name)
        if found < 0:
            raise KeyError(name)
        return self._base + found

    def get(self, name: bytes, default: int | None = None) -> int | None:  # type: ignore[override]
        """The child's inode, or ``default``."""
        found = self._find(name)
        return default if found < 0 else self._base + found

    def __contains__(self, name: object) -> bool:
        return isinstance(name, bytes) and self._find(name) >= 0

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.names)

    def __len__(self) -> int:
        return self._end - self._start

    def inode_at(self, k: int) -> int:
        """The inode of the ``k``-th child in name order (``names[k]``'s)."""
        if not 0 <= k < self._end - self._start:
            raise IndexError(k)
        return self._base + self._entries.kids[self._start + k]

    def inodes(self) -> Iterator[int]:
        """The children's inodes, in name order."""
        base = self._base
        return (base + k for k in self._entries.kids[self._start : self._end])


class _Names(Sequence[bytes]):
    """A directory's child names in order (bytes), read from the columns on demand."""

    __slots__ = ("_end", "_entries", "_start")

    def __init__(self, entries: SnapshotEntries, start: int, end: int) -> None:
        self._entries, self._start, self._end = entries, start, end

    @overload
    def __getitem__(self, k: int) -> bytes: ...
    @overload
    def __getitem__(self, k: slice) -> Sequence[bytes]: ...
    def __getitem__(self, k: int | slice) -> bytes | Sequence[bytes]:
        if isinstance(k, slice):
            return [self[j] for j in range(*k.indices(len(self)))]
        if k < 0:
            k += len(self)
        if not 0 <= k < self._end - self._start:
            raise IndexError(k)
        return self._entries.name(self._entries.kids[self._start + k])

    def __len__(self) -> int:
        return self._end - self._start


def _raw(digest: str) -> bytes:
    """``digest``'s 16 bytes when it is 32 lowercase hex characters (so ``.hex()`` gives
    it back exactly). Raises ValueError for any other string."""
    raw = bytes.fromhex(digest)
    if len(raw) != DIGEST_BYTES or raw.hex() != digest:
        raise ValueError(digest)
    return raw


def _u32(value: int, what: str) -> int:
    if value > _U32_MAX:
        raise ValueError(f"a snapshot of over {_U32_MAX:,} {what} is not supported")
    return value
