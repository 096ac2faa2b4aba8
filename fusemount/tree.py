"""The mount's inode table: which inode is which dataset, version, tag or file.

Inodes are assigned on first sight and never reused for the life of the FUSE connection,
so inode numbers stay stable. Entries of a snapshot are keyed by snapshot id and path, so
``v1`` and a tag pointing at it show the same inodes. A snapshot's manifest is loaded
once, when its tree is first entered; it never changes afterwards (snapshots are
immutable), and its entries get one contiguous range of numbers in the order the manifest
lists them, so a process that resumes the connection numbers them the same way from the
range alone (:mod:`fusemount.journal`).
"""

from __future__ import annotations

import bisect
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final

from fusemount.journal import InodeJournal
from protocol.hub.v1 import hub_pb2

ROOT_INODE: Final = 1
INODE_BITS: Final = 48
"""Inode numbers stay below 2**48, so a file handle can carry its inode
(:mod:`fusemount.operations`): 2.8e14 numbers, never reused within a connection."""


class Role(Enum):
    """Where in the tree a node sits."""

    ROOT = "root"  # MOUNT/
    DATASET = "dataset"  # MOUNT/<dataset>/
    VERSION = "version"  # MOUNT/<dataset>/<version>/ (a snapshot's root)
    TAG = "tag"  # MOUNT/<dataset>/<tag> -> <version>
    ENTRY = "entry"  # a file, directory or symlink inside a snapshot


@dataclass(slots=True)
class Node:
    """One inode (``slots``: no per-node ``__dict__``; a loaded snapshot holds one per
    file, so each byte here is a byte per file of every mounted snapshot).

    Attributes:
        inode: the inode number.
        role: where the node sits.
        mode: full ``st_mode`` (type and permission bits).
        size: bytes (files), target length (symlinks), 0 (directories).
        mtime_ns: modification time, ns since the epoch.
        dataset, version: the snapshot the node belongs to (empty for root).
        snapshot_id: the content digest of that snapshot (empty outside snapshots).
        nlink: hard-link count: 1 for files, symlinks and synthetic directories (whose
            subdirectory count is not known up front, as btrfs does), 2 + subdirectories for
            directories inside a snapshot.
        target: symlink target.
        blocks: a file's ``(digest, size)`` blocks in file order.
        position: a file with data: its index among its snapshot's files with data, in
            manifest order (:meth:`InodeTable.files`); -1 for anything else.
        children: name → inode, in listing order; None until loaded.
    """

    inode: int
    role: Role
    mode: int
    size: int = 0
    mtime_ns: int = 0
    dataset: str = ""
    version: str = ""
    snapshot_id: str = ""
    nlink: int = 1
    target: bytes = b""
    blocks: tuple[tuple[str, int], ...] = ()
    position: int = -1
    children: dict[bytes, int] | None = None
    child_names: Sequence[bytes] = ()  # a directory's sorted names, once loaded

    @property
    def is_dir(self) -> bool:
        """True for directories."""
        return stat.S_ISDIR(self.mode)

    @property
    def block_size(self) -> int:
        """Length of every block but the last, bytes (the file's first block's size)."""
        return self.blocks[0][1] if self.blocks else 0

    def set_children(self, children: dict[bytes, int]) -> None:
        """Replace the listing (names kept sorted so readdir offsets are stable)."""
        self.children = children
        self.child_names = sorted(children)


DIR_MODE: Final = stat.S_IFDIR | 0o555
LINK_MODE: Final = stat.S_IFLNK | 0o777

_TYPE_BITS: Final = {
    hub_pb2.ENTRY_TYPE_FILE: stat.S_IFREG,
    hub_pb2.ENTRY_TYPE_DIRECTORY: stat.S_IFDIR,
    hub_pb2.ENTRY_TYPE_SYMLINK: stat.S_IFLNK,
}


class InodeTable:
    """All nodes of the mount, by inode and by identity key, and the kernel's lookup counts.

    The kernel holds a reference per successful lookup (and per readdirplus entry) and
    gives them back in ``forget``; the counts say which inodes it still knows.
    """

    def __init__(self, journal: InodeJournal | None = None) -> None:
        self._nodes: dict[int, Node] = {ROOT_INODE: Node(ROOT_INODE, Role.ROOT, DIR_MODE)}
        self._by_key: dict[tuple[str, ...], int] = {}
        self._next = ROOT_INODE + 1
        self._lookups: dict[int, int] = {}  # inode -> the kernel's lookup count
        self._files: dict[str, list[Node]] = {}  # snapshot id -> files with data, in order
        self._ranges: dict[str, tuple[int, int]] = {}  # snapshot id -> (first inode, count)
        self._starts: list[tuple[int, int, str, int]] = []  # (first, count, id, root) sorted
        self.journal = journal
        self.resumed = False  # numbers replayed from a predecessor's journal

    def replay(self, records: list[dict[str, Any]]) -> None:
        """Take over the numbers a predecessor serving this FUSE connection gave out (its
        journal's records, :func:`fusemount.journal.read_journal`). Nodes of datasets,
        versions and tags are made now; a snapshot's entries when a request names one of
        its numbers (:meth:`pending_root`). The kernel's lookup counts from before are not
        known: every node counts as referenced from now on."""
        self._apply(records)
        self.resumed = True

    def sync(self) -> None:
        """Take in the numbers other mount workers of this connection gave out since the
        last look (their journal lines); nothing without a journal."""
        if self.journal is not None:
            self._apply(self.journal.new_records())

    def _apply(self, records: list[dict[str, Any]]) -> None:
        for r in records:
            if "key" in r:
                key = tuple(r["key"])
                if key in self._by_key:  # ours, or read before
                    continue
                node = Node(
                    r["inode"], Role(r["role"]), r["mode"], size=r["size"],
                    mtime_ns=r["mtime_ns"], dataset=r["dataset"], version=r["version"],
                    snapshot_id=r["snapshot_id"], target=r["target"].encode(),
                )  # fmt: skip
                self._nodes[node.inode] = node
                self._by_key[key] = node.inode
                self._next = max(self._next, node.inode + 1)
            elif "snapshot" in r and r["snapshot"] not in self._ranges:
                self._add_range(r["snapshot"], r["first"], r["count"], r["root"])

    def _add_range(self, snapshot_id: str, first: int, count: int, root: int) -> None:
        self._ranges[snapshot_id] = (first, count)
        bisect.insort(self._starts, (first, count, snapshot_id, root))
        self._next = max(self._next, first + count)

    def pending_root(self, inode: int) -> Node | None:
        """For an inode not in the table but inside a replayed snapshot range: the version
        node whose tree, once loaded, holds it (None: no such range)."""
        i = bisect.bisect_right(self._starts, (inode, 1 << 62)) - 1
        if i < 0:
            return None
        first, count, _, root = self._starts[i]
        if not first <= inode < first + count:
            return None
        return self._nodes.get(root)

    def snapshot_of(self, inode: int) -> str:
        """The snapshot id whose range holds ``inode`` ("" when none does)."""
        i = bisect.bisect_right(self._starts, (inode, 1 << 62)) - 1
        if i < 0:
            return ""
        first, count, snapshot_id, _ = self._starts[i]
        return snapshot_id if first <= inode < first + count else ""

    def remember(self, inode: int) -> None:
        """The kernel took one more reference to ``inode`` (a lookup reply)."""
        self._lookups[inode] = self._lookups.get(inode, 0) + 1

    def forget(self, inode: int, nlookup: int) -> None:
        """The kernel gave back ``nlookup`` references to ``inode``."""
        left = self._lookups.get(inode, 0) - nlookup
        if left > 0:
            self._lookups[inode] = left
        else:
            self._lookups.pop(inode, None)

    def referenced(self, inode: int) -> bool:
        """True while the kernel holds a reference to ``inode`` (always, after a hand-over:
        the references taken before it are not known)."""
        return self.resumed or inode in self._lookups

    @property
    def kernel_refs(self) -> int:
        """Inodes the kernel currently holds a lookup reference to."""
        return len(self._lookups)

    def __getitem__(self, inode: int) -> Node:
        return self._nodes[inode]

    def nodes(self) -> list[Node]:
        """Every node (a snapshot of the table)."""
        return list(self._nodes.values())

    def get(self, inode: int) -> Node | None:
        """The node, or None for an unknown inode."""
        return self._nodes.get(inode)

    def __len__(self) -> int:
        return len(self._nodes)

    def files(self, snapshot_id: str) -> list[Node]:
        """A loaded snapshot's regular files with data, in manifest (path) order: the
        order a reader walking its directories reads them in (empty if not loaded)."""
        return self._files.get(snapshot_id, [])

    def intern(self, key: tuple[str, ...], make: Node, inode: int = 0) -> Node:
        """The node for ``key``: the existing one (refreshed from ``make``'s fields for
        mutable nodes such as tags) or ``make`` itself with a fresh inode (the next one,
        journaled). A snapshot entry is given its ``inode`` (its number in its snapshot's
        range, which the manifest's order fixes): that number is its key, the node there
        if there is one, else ``make``.

        Raises:
            OverflowError: the connection used up its 2**48 inode numbers.
        """
        if inode:  # a snapshot entry: its number is its key (the range is the snapshot's)
            entry = self._nodes.get(inode)
            if entry is not None:
                return entry
            if inode >= 1 << INODE_BITS:
                raise OverflowError("inode numbers of this FUSE connection are used up")
            make.inode = inode
            self._nodes[inode] = make  # not in _by_key: a key per file cost ~250 B each
            return make
        known = self._by_key.get(key)
        if known is not None:
            node = self._nodes[known]
            if node.role is Role.TAG:
                node.target, node.size = make.target, make.size
            return node
        if self.journal is not None:
            with self.journal.allocating():  # other workers may give out numbers too
                self.sync()
                if key in self._by_key:  # another worker numbered it meanwhile
                    return self.intern(key, make)
                inode = self._next
                self._next += 1
                self.journal.append(
                    {
                        "key": list(key), "inode": inode, "role": make.role.value,
                        "mode": make.mode, "size": make.size, "mtime_ns": make.mtime_ns,
                        "dataset": make.dataset, "version": make.version,
                        "snapshot_id": make.snapshot_id, "target": make.target.decode(),
                    }
                )  # fmt: skip
        else:
            inode = self._next
            self._next += 1
        if inode >= 1 << INODE_BITS:
            raise OverflowError("inode numbers of this FUSE connection are used up")
        make.inode = inode
        self._nodes[inode] = make
        self._by_key[key] = inode
        return make

    def _reserve(self, snapshot_id: str, count: int, root: int) -> tuple[int, int]:
        """The snapshot's range ``(first, count)``: the one given before (here, by a
        predecessor or by another worker: read under the journal's lock), else a new one
        at the end, journaled."""
        known = self._ranges.get(snapshot_id)
        if known is not None:
            return known
        if self.journal is None:
            self._add_range(snapshot_id, self._next, count, root)
            return self._ranges[snapshot_id]
        with self.journal.allocating():
            self.sync()
            known = self._ranges.get(snapshot_id)
            if known is not None:
                return known
            first = self._next
            self._add_range(snapshot_id, first, count, root)
            self.journal.append(
                {"snapshot": snapshot_id, "first": first, "count": count, "root": root}
            )
        return first, count

    def load_snapshot(
        self, root: Node, snapshot_id: str, entries: list[hub_pb2.ManifestEntry]
    ) -> None:
        """Build the nodes of one snapshot under ``root`` (a VERSION node) from its manifest.

        Entries arrive in path order; a parent directory missing from the manifest is made
        implicitly. The entries are numbered from the snapshot's range (the one it was
        given before, in this process or a predecessor, or a new one at the end, journaled)
        in the order they are made here, which depends on the manifest alone.
        """
        dirs: dict[str, Node] = {"": root}
        pending: dict[int, dict[bytes, int]] = {root.inode: {}}
        files: list[Node] = []
        known = self._reserve(snapshot_id, _count_nodes(entries), root.inode)
        first = known[0]
        cursor = [first]

        def parent_of(path: str) -> Node:
            head, _, _ = path.rpartition("/")
            if head not in dirs:
                implicit = hub_pb2.ManifestEntry(
                    path=head, type=hub_pb2.ENTRY_TYPE_DIRECTORY, mode=0o555
                )
                add(implicit)
            return dirs[head]

        def add(entry: hub_pb2.ManifestEntry) -> None:
            parent = parent_of(entry.path)
            mode = _TYPE_BITS.get(entry.type, stat.S_IFREG) | (entry.mode & 0o7777)
            number = cursor[0]
            cursor[0] += 1
            node = self.intern(
                (),  # numbered from the snapshot's range: no key
                Node(
                    0,
                    Role.ENTRY,
                    mode,
                    size=entry.size,
                    mtime_ns=entry.mtime_ns,
                    dataset=root.dataset,
                    version=root.version,
                    snapshot_id=snapshot_id,
                    target=entry.symlink_target.encode(),
                    blocks=tuple((b.digest, b.size) for b in entry.blocks),
                ),
                inode=number,
            )
            pending[parent.inode][entry.path.rpartition("/")[2].encode()] = node.inode
            if stat.S_ISREG(node.mode) and node.blocks and node.position < 0:
                node.position = len(files)
                files.append(node)
            if node.is_dir:
                dirs[entry.path] = node
                pending.setdefault(node.inode, {})

        for entry in entries:
            if entry.path not in dirs:
                add(entry)
        count = cursor[0] - first
        if count != known[1]:
            raise ValueError(f"snapshot {snapshot_id} numbered {count} entries, not {known[1]}")
        self._files.setdefault(snapshot_id, files)
        for inode, children in pending.items():
            node = self._nodes[inode]
            node.set_children(children)
            if node.role is Role.ENTRY:
                node.nlink = 2 + sum(self._nodes[c].is_dir for c in children.values())


def _count_nodes(entries: list[hub_pb2.ManifestEntry]) -> int:
    """How many nodes :meth:`InodeTable.load_snapshot` makes of ``entries``: one per path,
    listed or an implicit parent directory (the root excluded), so that a range can be
    reserved before the nodes are made."""
    paths: set[str] = set()
    for entry in entries:
        path = entry.path
        while path and path not in paths:
            paths.add(path)
            path = path.rpartition("/")[0]
    return len(paths)
