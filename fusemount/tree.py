"""The mount's inode table: which inode is which dataset, version, tag or file.

Inodes are assigned on first sight and never reused for the life of the FUSE connection,
so inode numbers stay stable. Entries of a snapshot are keyed by snapshot id and path, so
``v1`` and a tag pointing at it show the same inodes. A snapshot's manifest is loaded
once, when its tree is first entered; it never changes afterwards (snapshots are
immutable), and its entries get one contiguous range of numbers in the order the manifest
lists them, so a process that resumes the connection numbers them the same way from the
range alone (:mod:`fusemount.journal`).

The root, datasets, versions and tags are :class:`Node` objects kept here. A snapshot's
entries are not: they are columns (:class:`~fusemount.entries.SnapshotEntries`, about 90
bytes a file), and :meth:`InodeTable.get` makes a ``Node`` for an entry when one is asked
for, keeping only the :data:`MADE_NODES` made last. A snapshot none of whose entries the
kernel has held for a while is unloaded (:meth:`InodeTable.unload_idle`): its range stays,
so its next load numbers its entries the same. Before, every snapshot walked stayed
loaded for the life of the mount — about 125 bytes a file a version, 3.7 GiB for one
reader's ``find`` over 30 versions of a million files (issue 39's seventeenth probe).
"""

from __future__ import annotations

import bisect
import stat
import time
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final

from fusemount.entries import SnapshotEntries
from fusemount.journal import InodeJournal
from fusemount.loaded import LoadedSnapshot, SnapshotFiles
from protocol.hub.v1 import hub_pb2

ROOT_INODE: Final = 1
MADE_NODES: Final = 4096
"""Entry nodes kept once made (the oldest dropped first): a lookup, ``getattr`` and
``open`` of one file make it once; 4,096 cost about 2 MiB whatever the snapshots' size."""
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
    """One inode (``slots``: no per-node ``__dict__``). The table keeps those of the root,
    datasets, versions and tags; a snapshot entry's is made when asked for
    (:meth:`InodeTable.get`) from its snapshot's columns.

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
        children: name → inode (a dict, or a snapshot directory's
            :class:`~fusemount.entries.Listing`); None until loaded, and for non-directories.
        child_names: the children's names, sorted (readdir's offsets).
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
    children: Mapping[bytes, int] | None = None
    child_names: Sequence[bytes] = ()

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


class InodeTable:
    """All nodes of the mount, by inode and by identity key, and the kernel's lookup counts.

    Twenty-three methods over one table whose three indexes (inode, key, a snapshot's
    entries) and lookup counts must change together under the kernel's protocol
    (lookup, forget, hand-over journal); a snapshot's entries are columns in
    :mod:`fusemount.entries`.

    The kernel holds a reference per successful lookup (and per readdirplus entry) and
    gives them back in ``forget``; the counts say which inodes it still knows (a loaded
    snapshot's entries' counts in an array beside its columns, 8 bytes an entry).
    """

    def __init__(
        self, journal: InodeJournal | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._clock = clock
        self._nodes: dict[int, Node] = {ROOT_INODE: Node(ROOT_INODE, Role.ROOT, DIR_MODE)}
        self._by_key: dict[tuple[str, ...], int] = {}
        self._next = ROOT_INODE + 1
        self._lookups: dict[int, int] = {}  # inode -> the kernel's lookup count
        self._loaded: dict[str, LoadedSnapshot] = {}  # snapshot id -> its entries
        self._entry_refs = 0  # loaded entries the kernel holds a reference to
        self._made: dict[int, Node] = {}  # entry nodes made last, oldest first
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
        found = self._locate(inode)
        if found is None:
            self._lookups[inode] = self._lookups.get(inode, 0) + 1
            return
        loaded, i = found
        if not loaded.refs[i]:
            self._entry_refs += 1
            loaded.held += 1
        loaded.refs[i] += 1

    def forget(self, inode: int, nlookup: int) -> None:
        """The kernel gave back ``nlookup`` references to ``inode``."""
        found = self._locate(inode)
        if found is not None:
            loaded, i = found
            held = loaded.refs[i]
            loaded.refs[i] = max(0, held - nlookup)
            if held and not loaded.refs[i]:
                self._entry_refs -= 1
                loaded.held -= 1
                if not loaded.held:
                    loaded.idle_since = self._clock()
            return
        left = self._lookups.get(inode, 0) - nlookup
        if left > 0:
            self._lookups[inode] = left
        else:
            self._lookups.pop(inode, None)

    def referenced(self, inode: int) -> bool:
        """True while the kernel holds a reference to ``inode`` (always, after a hand-over:
        the references taken before it are not known)."""
        if self.resumed or inode in self._lookups:
            return True
        found = self._locate(inode)
        return found is not None and found[0].refs[found[1]] > 0

    @property
    def kernel_refs(self) -> int:
        """Inodes the kernel currently holds a lookup reference to."""
        return len(self._lookups) + self._entry_refs

    def __getitem__(self, inode: int) -> Node:
        node = self.get(inode)
        if node is None:
            raise KeyError(inode)
        return node

    def nodes(self) -> list[Node]:
        """The root, datasets, versions and tags (a snapshot of the table); snapshot
        entries are not in it (:meth:`entry_inodes`)."""
        return list(self._nodes.values())

    def get(self, inode: int) -> Node | None:
        """The node, or None for an unknown inode (a snapshot entry's is made now)."""
        node = self._nodes.get(inode) or self._made.get(inode)
        if node is not None:
            return node
        found = self._locate(inode)
        return None if found is None else self._entry_node(*found)

    def __len__(self) -> int:
        return len(self._nodes) + sum(loaded.count for loaded in self._loaded.values())

    def files(self, snapshot_id: str) -> Sequence[Node]:
        """A loaded snapshot's regular files with data, in manifest (path) order: the
        order a reader walking its directories reads them in (empty if not loaded); each
        node is made when indexed."""
        loaded = self._loaded.get(snapshot_id)
        return () if loaded is None else SnapshotFiles(self._entry_node, loaded)

    def intern(self, key: tuple[str, ...], make: Node) -> Node:
        """The node for ``key``: the existing one (refreshed from ``make``'s fields for
        mutable nodes such as tags) or ``make`` itself with a fresh inode (the next one,
        journaled). Snapshot entries are not interned (:meth:`attach`).

        Raises:
            OverflowError: the connection used up its 2**48 inode numbers.
        """
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
        self, root: Node, snapshot_id: str, entries: Iterable[hub_pb2.ManifestEntry]
    ) -> None:
        """Build the entries of one snapshot under ``root`` (a VERSION node) from its
        manifest (:meth:`SnapshotEntries.build`) and :meth:`attach` them."""
        self.attach(root, snapshot_id, SnapshotEntries.build(entries))

    def attach(self, root: Node, snapshot_id: str, entries: SnapshotEntries) -> None:
        """Give a built snapshot its inode range and list it under ``root`` (a VERSION
        node). The range is the one it was given before (in this process, by a predecessor
        or by another worker), else a new one at the end, journaled; its entries are
        numbered in :meth:`SnapshotEntries.build`'s order, which depends on the manifest
        alone. A snapshot loaded before (the same content under another version or tag)
        keeps its first entries, as the same inodes.

        Raises:
            ValueError: the snapshot's known range has another size than ``entries``.
        """
        loaded = self._loaded.get(snapshot_id)
        if loaded is None:
            first, count = self._reserve(snapshot_id, entries.count, root.inode)
            if first + count > 1 << INODE_BITS:
                raise OverflowError("inode numbers of this FUSE connection are used up")
            if count != entries.count:
                raise ValueError(
                    f"snapshot {snapshot_id} numbered {entries.count} entries, not {count}"
                )
            refs = array("Q", bytes(8 * (count + 1)))
            loaded = LoadedSnapshot(snapshot_id, first, entries, root.dataset, root.version, refs)
            loaded.idle_since = self._clock()
            self._loaded[snapshot_id] = loaded
        listing = loaded.entries.listing(0, loaded.first)
        root.children, root.child_names = listing, listing.names

    def unload_idle(self, after_s: float) -> int:
        """Unloads the snapshots none of whose entries the kernel has held for ``after_s``
        seconds (nothing after a hand-over or beside other workers: their references are
        not known here). Their version nodes list nothing until entered again, which
        loads the snapshot anew into its own range (the same numbers). Returns how many."""
        if self.resumed:
            return 0
        too_old = self._clock() - after_s
        idle = [
            s
            for s, loaded in self._loaded.items()
            if not loaded.held and loaded.idle_since <= too_old
        ]
        for snapshot_id in idle:
            loaded = self._loaded.pop(snapshot_id)
            for node in self._nodes.values():
                if node.role is Role.VERSION and node.snapshot_id == snapshot_id:
                    node.children, node.child_names = None, ()
            end = loaded.first + loaded.count
            for inode in [i for i in self._made if loaded.first <= i < end]:
                del self._made[inode]
        return len(idle)

    def entry_inodes(self, snapshot_id: str) -> range:
        """The inodes of a loaded snapshot's entries (empty if not loaded)."""
        loaded = self._loaded.get(snapshot_id)
        return range(0) if loaded is None else range(loaded.first, loaded.first + loaded.count)

    def _locate(self, inode: int) -> tuple[LoadedSnapshot, int] | None:
        """The loaded snapshot holding entry ``inode`` and its index there, or None."""
        i = bisect.bisect_right(self._starts, (inode, 1 << 62)) - 1
        if i < 0:
            return None
        first, count, snapshot_id, _ = self._starts[i]
        if inode >= first + count:
            return None
        loaded = self._loaded.get(snapshot_id)
        return None if loaded is None else (loaded, inode - first + 1)

    def _entry_node(self, loaded: LoadedSnapshot, i: int) -> Node:
        """The :class:`Node` of entry ``i`` of ``loaded``: one of the :data:`MADE_NODES`
        made last, else a new one (kept among them)."""
        inode = loaded.first + i - 1
        made = self._made
        node = made.get(inode)
        if node is not None:
            return node
        e = loaded.entries
        mode = e.modes[i]
        listing = e.listing(i, loaded.first) if stat.S_ISDIR(mode) else None
        node = Node(
            inode,
            Role.ENTRY,
            mode,
            e.sizes[i],
            e.mtimes[i],
            loaded.dataset,
            loaded.version,
            loaded.snapshot_id,
            e.nlinks[i],
            e.target(i),
            e.blocks(i),
            e.positions[i],
            listing,
            () if listing is None else listing.names,
        )  # fmt: skip (Node's fields in order)
        if len(made) >= MADE_NODES:
            del made[next(iter(made))]  # the oldest made
        made[inode] = node
        return node
