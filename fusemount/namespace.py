"""The mount's view of the catalog: listings loaded, refreshed in the background, revoked.

The root lists datasets, a dataset lists its versions and tags, a version's tree comes from
its manifest (immutable: loaded once, under a per-snapshot lock). Root and dataset listings
are mutable; once loaded they are served from memory and one background task
(:meth:`Namespace.refresh_forever`) refreshes them about once a second, so a lookup never
waits on the daemon for a listing it already has — a hub that stops answering cannot stall
lookups of cached files. Only a listing never loaded is fetched while the lookup waits.

A refresh that finds a moved tag or a vanished version invalidates that name in the
kernel's dentry cache; a version gone from every listing (no live version serves its
snapshot id) is *revoked*: its entries answer ENOENT, its open files EIO, and the kernel is
told to drop its cached pages so those reads reach the mount.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable, Mapping

import pyfuse3
import trio

from fusemount.client import DaemonClient
from fusemount.entries import SnapshotEntries
from fusemount.tree import DIR_MODE, LINK_MODE, ROOT_INODE, InodeTable, Node, Role
from strata_local.memory import trim_malloc

LISTING_TTL = 1.0  # seconds between background refreshes of root and dataset listings
UNLOAD_AFTER_S = 60.0
"""A loaded snapshot none of whose entries the kernel has held this long is unloaded
(:meth:`fusemount.tree.InodeTable.unload_idle`), seconds."""

log = logging.getLogger(__name__)


class Namespace:
    """Listings of the root and datasets, snapshot trees, and revocation.

    Args:
        client: the daemon connection (catalog calls, each in a worker thread).
        inodes: the mount's inode table (also the kernel's lookup counts).
    """

    def __init__(self, client: DaemonClient, inodes: InodeTable) -> None:
        self.client = client
        self.inodes = inodes
        self.revoked: set[str] = set()  # snapshot ids no live version serves any more
        self.on_revoked: Callable[[], None] | None = None  # called after each revocation
        self.refreshed: dict[int, float] = {}  # inode -> monotonic time of its last refresh
        self._snapshot_locks: dict[int, trio.Lock] = {}
        self._first_load: dict[int, trio.Lock] = {}

    def check_live(self, node: Node) -> None:
        """Raise ENOENT for a node of a revoked snapshot."""
        if node.snapshot_id and node.snapshot_id in self.revoked:
            raise pyfuse3.FUSEError(errno.ENOENT)

    def is_revoked(self, node: Node) -> bool:
        """True when ``node`` belongs to a revoked snapshot."""
        return bool(node.snapshot_id) and node.snapshot_id in self.revoked

    async def children(self, node: Node) -> Mapping[bytes, int]:
        """The node's listing: stored, or loaded now if it never was.

        Raises:
            pyfuse3.FUSEError: ENOTDIR for a node without children.
            grpc.RpcError: a first load failed (the boundary maps it).
        """
        if node.children is None:
            if node.role is Role.ROOT:
                await self._load_once(node, self._load_root)
            elif node.role is Role.DATASET:
                await self._load_once(node, self._load_dataset)
            else:
                await self._load_snapshot(node)
        if node.children is None:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return node.children

    async def _load_once(self, node: Node, load: object) -> None:
        lock = self._first_load.setdefault(node.inode, trio.Lock())
        async with lock:  # concurrent first lookups share one catalog call
            if node.children is None:
                await load(node)  # type: ignore[operator]
                self.refreshed[node.inode] = time.monotonic()

    async def _load_root(self, root: Node) -> None:
        # abandon_on_cancel (here and below): a mount told to stop (SIGUSR2: hand-over,
        # succession) abandons a call that waits for an absent daemon (up to 10 s)
        names = await trio.to_thread.run_sync(self.client.list_datasets, abandon_on_cancel=True)
        children: dict[bytes, int] = {}
        for name in names:
            node = self.inodes.intern(
                ("dataset", name), Node(0, Role.DATASET, DIR_MODE, dataset=name)
            )
            children[name.encode()] = node.inode
        root.set_children(children)

    async def _load_dataset(self, ds: Node) -> None:
        reply = await trio.to_thread.run_sync(
            self.client.list_versions, ds.dataset, abandon_on_cancel=True
        )
        children: dict[bytes, int] = {}
        for snap in reply.versions:
            node = self.inodes.intern(
                ("version", ds.dataset, snap.version),
                Node(
                    0,
                    Role.VERSION,
                    DIR_MODE,
                    mtime_ns=snap.created_ns,
                    dataset=ds.dataset,
                    version=snap.version,
                    snapshot_id=snap.snapshot_id,
                ),
            )
            children[snap.version.encode()] = node.inode
        for tag in reply.tags:
            target = tag.version.encode()
            node = self.inodes.intern(
                ("tag", ds.dataset, tag.name),
                Node(
                    0,
                    Role.TAG,
                    LINK_MODE,
                    size=len(target),
                    dataset=ds.dataset,
                    version=tag.version,
                    target=target,
                ),
            )
            children[tag.name.encode()] = node.inode
        ds.set_children(children)

    async def _load_snapshot(self, root: Node) -> None:
        lock = self._snapshot_locks.setdefault(root.inode, trio.Lock())
        async with lock:
            if root.children is not None:
                return
            # the manifest's pages are read and laid out in columns in a worker thread, a
            # page at a time (a million entries would hold the loop for seconds)
            entries = await trio.to_thread.run_sync(self._build, root, abandon_on_cancel=True)
            self.inodes.attach(root, root.snapshot_id, entries)

    def _build(self, root: Node) -> SnapshotEntries:
        """A snapshot's columns from the daemon's manifest pages (in a worker thread); the
        pages' freed memory is given back to the kernel after (malloc_trim)."""
        entries = SnapshotEntries.build(self.client.manifest(root.dataset, root.version))
        trim_malloc()
        return entries

    async def refresh_forever(self, interval: float = LISTING_TTL) -> None:
        """Refresh loaded listings every ``interval`` seconds, so new datasets and versions,
        tag moves and revocations show within about a second (a failed refresh keeps the
        last listing), and unload snapshots the kernel has held nothing of for
        :data:`UNLOAD_AFTER_S` (:meth:`~fusemount.tree.InodeTable.unload_idle`)."""
        while True:
            await trio.sleep(interval)
            await self.refresh()
            if self.inodes.unload_idle(UNLOAD_AFTER_S):
                await trio.to_thread.run_sync(trim_malloc)  # the columns' pages back

    async def refresh(self) -> None:
        """One pass: the root listing, then every loaded dataset listing."""
        root = self.inodes[ROOT_INODE]
        if root.children is not None:
            try:
                await self._load_root(root)
                self.refreshed[root.inode] = time.monotonic()
            except Exception as err:  # the daemon may be restarting: keep the last listing
                log.debug("refresh of the dataset list failed: %s", err)
        for ds in [n for n in self.inodes.nodes() if n.role is Role.DATASET]:
            if ds.children is not None:
                await self._refresh_dataset(ds)

    async def _refresh_dataset(self, ds: Node) -> None:
        before = {
            name: (inode, self.inodes[inode].target) for name, inode in (ds.children or {}).items()
        }
        try:
            await self._load_dataset(ds)
        except Exception as err:  # the daemon may be restarting: keep the last listing
            log.debug("refresh of %s failed: %s", ds.dataset, err)
            return
        self.refreshed[ds.inode] = time.monotonic()
        after = ds.children or {}
        live = {
            self.inodes[i].snapshot_id
            for i in after.values()
            if self.inodes[i].role is Role.VERSION
        }
        for name, (inode, target) in before.items():
            node = self.inodes[inode]
            if name in after and node.target == target:
                continue
            if node.role is Role.VERSION and name not in after and node.snapshot_id not in live:
                log.warning("%s %s was revoked", ds.dataset, node.version)
                self.revoked.add(node.snapshot_id)
                if self.on_revoked is not None:
                    self.on_revoked()
                await self._drop_cached_pages(node.snapshot_id)
            pyfuse3.invalidate_entry_async(ds.inode, name, ignore_enoent=True)

    async def _drop_cached_pages(self, snapshot_id: str) -> None:
        """Make the kernel forget the pages of a revoked snapshot's files, so reads on files
        opened before the revocation reach the mount (and get EIO) instead of its page cache."""
        inodes = self.inodes
        known = [
            n.inode
            for n in inodes.nodes()
            if n.snapshot_id == snapshot_id and inodes.referenced(n.inode)
        ]
        known += [i for i in inodes.entry_inodes(snapshot_id) if inodes.referenced(i)]

        def invalidate() -> None:
            for inode in known:
                try:
                    pyfuse3.invalidate_inode(inode, attr_only=False)
                except OSError as err:  # the kernel already forgot it
                    log.debug("invalidate_inode(%d): %s", inode, err)

        await trio.to_thread.run_sync(invalidate)
