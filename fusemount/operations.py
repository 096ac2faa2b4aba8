"""pyfuse3 ``Operations`` for Strata's read-only tree.

The class translates kernel requests into lookups in the inode table and reads through
the block reader; it owns no bytes. Every handler goes through :func:`boundary`.

Kernel caching: snapshot trees are immutable, so their entries and attributes are cached
for an hour, negative lookups inside them too, and files open with ``keep_cache``. The root,
dataset directories and tag symlinks can change (new versions, moved tags): one second.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from collections.abc import Sequence

import pyfuse3
import trio

from fusemount.boundary import UNEXPECTED_ERRORS, boundary
from fusemount.client import DaemonClient
from fusemount.readahead import Readahead
from fusemount.reader import BlockReader
from fusemount.tree import DIR_MODE, LINK_MODE, InodeTable, Node, Role

log = logging.getLogger(__name__)

SNAPSHOT_TIMEOUT = 3600.0  # seconds: immutable snapshot trees
MUTABLE_TIMEOUT = 1.0  # seconds: root, dataset listings, tag symlinks
LISTING_TTL = 1.0  # seconds between catalog refreshes of root and dataset listings
BLKSIZE = 128 * 1024

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class StrataOperations(pyfuse3.Operations):  # type: ignore[misc]
    """The read-only filesystem ``MOUNT/<dataset>/<version>/…``.

    Args:
        client: the daemon connection (catalog and misses).
        reader: serves file bytes.
    """

    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, client: DaemonClient, reader: BlockReader) -> None:
        super().__init__()
        self.client = client
        self.reader = reader
        self.inodes = InodeTable()
        self._handles: dict[int, tuple[Node, Readahead]] = {}
        self._next_fh = 1
        self._refreshed: dict[int, float] = {}
        self._lookups: dict[int, int] = {}  # inode -> the kernel's lookup count
        self._revoked: set[str] = set()  # snapshot ids no live version serves any more
        self._snapshot_locks: dict[int, trio.Lock] = {}
        self._uid = os.getuid()
        self._gid = os.getgid()

    # -- attributes ---------------------------------------------------------------

    def _attr(self, node: Node) -> pyfuse3.EntryAttributes:
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = node.inode
        attr.st_mode = node.mode
        attr.st_nlink = node.nlink
        attr.st_size = node.size
        attr.st_uid = self._uid
        attr.st_gid = self._gid
        attr.st_blksize = BLKSIZE
        attr.st_blocks = (node.size + 511) // 512
        attr.st_atime_ns = attr.st_mtime_ns = attr.st_ctime_ns = node.mtime_ns
        timeout = SNAPSHOT_TIMEOUT if node.role in (Role.ENTRY, Role.VERSION) else MUTABLE_TIMEOUT
        attr.entry_timeout = timeout
        attr.attr_timeout = timeout
        return attr

    # -- loading the tree -----------------------------------------------------------

    async def _children(self, node: Node) -> dict[bytes, int]:
        """The node's listing, loaded or refreshed as its role requires."""
        if node.role is Role.ROOT:
            await self._refresh(node, self._load_root)
        elif node.role is Role.DATASET:
            await self._refresh(node, self._load_dataset)
        elif node.children is None:
            await self._load_snapshot(node)
        if node.children is None:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return node.children

    async def _refresh(self, node: Node, load: object) -> None:
        now = time.monotonic()
        if node.children is not None and now - self._refreshed.get(node.inode, 0.0) < LISTING_TTL:
            return
        try:
            await load(node)  # type: ignore[operator]
            self._refreshed[node.inode] = now
        except Exception:
            if node.children is None:
                raise
            log.warning(
                "catalog refresh of inode %d failed; serving the last listing",
                node.inode,
                exc_info=True,
            )

    async def _load_root(self, root: Node) -> None:
        names = await trio.to_thread.run_sync(self.client.list_datasets)
        children: dict[bytes, int] = {}
        for name in names:
            node = self.inodes.intern(
                ("dataset", name), Node(0, Role.DATASET, DIR_MODE, dataset=name)
            )
            children[name.encode()] = node.inode
        root.set_children(children)

    async def _load_dataset(self, ds: Node) -> None:
        reply = await trio.to_thread.run_sync(self.client.list_versions, ds.dataset)
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
            entries = await trio.to_thread.run_sync(
                self.client.manifest, root.dataset, root.version
            )
            self.inodes.load_snapshot(root, root.snapshot_id, entries)

    async def watch_catalog(self, interval: float = LISTING_TTL) -> None:
        """Keep loaded dataset listings fresh so tag moves and revocations show within
        about a second: moved tags and vanished versions are invalidated in the kernel's
        dentry cache, and a revoked snapshot's open files fail with EIO from then on."""
        while True:
            await trio.sleep(interval)
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
        self._refreshed[ds.inode] = time.monotonic()
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
                self._revoked.add(node.snapshot_id)
                await self._drop_cached_pages(node.snapshot_id)
            pyfuse3.invalidate_entry_async(ds.inode, name, ignore_enoent=True)

    async def _drop_cached_pages(self, snapshot_id: str) -> None:
        """Make the kernel forget the pages of a revoked snapshot's files, so reads on files
        opened before the revocation reach us (and get EIO) instead of its page cache."""
        known = [
            n.inode
            for n in self.inodes.nodes()
            if n.snapshot_id == snapshot_id and n.inode in self._lookups
        ]

        def invalidate() -> None:
            for inode in known:
                try:
                    pyfuse3.invalidate_inode(inode, attr_only=False)
                except OSError as err:  # the kernel already forgot it
                    log.debug("invalidate_inode(%d): %s", inode, err)

        await trio.to_thread.run_sync(invalidate)

    def _check_live(self, node: Node) -> None:
        if node.snapshot_id and node.snapshot_id in self._revoked:
            raise pyfuse3.FUSEError(errno.ENOENT)

    def _node(self, inode: int) -> Node:
        node = self.inodes.get(inode)
        if node is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return node

    # -- handlers -----------------------------------------------------------------------

    @boundary
    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        parent = self._node(parent_inode)
        self._check_live(parent)
        if not parent.is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        if name == b".":
            return self._attr(parent)
        children = await self._children(parent)
        inode = children.get(name)
        if inode is None:
            if parent.role in (Role.VERSION, Role.ENTRY):
                negative = pyfuse3.EntryAttributes()  # st_ino 0: the kernel caches the ENOENT
                negative.st_ino = 0
                negative.entry_timeout = SNAPSHOT_TIMEOUT
                return negative
            raise pyfuse3.FUSEError(errno.ENOENT)
        self._lookups[inode] = self._lookups.get(inode, 0) + 1
        return self._attr(self.inodes[inode])

    @boundary
    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return self._attr(self._node(inode))

    @boundary
    async def readlink(self, inode: int, ctx: pyfuse3.RequestContext) -> bytes:
        node = self._node(inode)
        if not stat.S_ISLNK(node.mode):
            raise pyfuse3.FUSEError(errno.EINVAL)
        return node.target

    @boundary
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        node = self._node(inode)
        if not node.is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        await self._children(node)
        return inode

    @boundary
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        node = self._node(fh)
        await self._children(node)
        names = node.child_names
        children = node.children or {}
        for i in range(start_id, len(names)):
            child = self.inodes[children[names[i]]]
            if not pyfuse3.readdir_reply(token, names[i], self._attr(child), i + 1):
                break
            # readdirplus: each entry returned counts as a lookup
            self._lookups[child.inode] = self._lookups.get(child.inode, 0) + 1

    @boundary
    async def releasedir(self, fh: int) -> None:
        return None

    @boundary
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        node = self._node(inode)
        self._check_live(node)
        if flags & _WRITE_FLAGS:
            raise pyfuse3.FUSEError(errno.EROFS)
        if node.is_dir:
            raise pyfuse3.FUSEError(errno.EISDIR)
        fh = self._next_fh
        self._next_fh += 1
        self._handles[fh] = (node, Readahead())
        return pyfuse3.FileInfo(fh=fh, keep_cache=True)

    @boundary
    async def read(self, fh: int, off: int, size: int) -> bytes:
        handle = self._handles.get(fh)
        if handle is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        node, readahead = handle
        if node.snapshot_id in self._revoked:
            raise pyfuse3.FUSEError(errno.EIO)  # open before the revocation: never more bytes
        return await self.reader.read(node, off, size, readahead)

    @boundary
    async def release(self, fh: int) -> None:
        self._handles.pop(fh, None)

    @boundary
    async def access(self, inode: int, mode: int, ctx: pyfuse3.RequestContext) -> bool:
        self._node(inode)
        return not mode & os.W_OK

    @boundary
    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        st = pyfuse3.StatvfsData()
        st.f_bsize = BLKSIZE
        st.f_frsize = 4096
        st.f_blocks = 0
        st.f_bfree = st.f_bavail = 0
        st.f_files = len(self.inodes)
        st.f_ffree = st.f_favail = 0
        st.f_namemax = 255
        return st

    @boundary
    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        # The inode table keeps every number for the life of the mount (numbers stay stable);
        # what forget balances is the kernel's references, so none leak.
        for inode, nlookup in inode_list:
            left = self._lookups.get(inode, 0) - nlookup
            if left > 0:
                self._lookups[inode] = left
            else:
                self._lookups.pop(inode, None)

    @property
    def kernel_refs(self) -> int:
        """Inodes the kernel currently holds a lookup reference to."""
        return len(self._lookups)

    # -- extended attributes ------------------------------------------------------------

    def _xattrs(self, node: Node) -> dict[bytes, bytes]:
        out: dict[bytes, bytes] = {}
        if node.snapshot_id:
            out[b"user.strata.snapshot_id"] = node.snapshot_id.encode()
        if node.version:
            out[b"user.strata.version"] = node.version.encode()
        if node.role is Role.ROOT:
            out[b"user.strata.kernel_refs"] = str(self.kernel_refs).encode()
            out[b"user.strata.inodes"] = str(len(self.inodes)).encode()
            errors = sum(UNEXPECTED_ERRORS.values())
            out[b"user.strata.handler_errors"] = str(errors).encode()
        return out

    @boundary
    async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
        # ``ls -l`` asks for security.* and system.* names on every file: answer those
        # first, without any work (the hot path of listing large directories).
        if not name.startswith(b"user.strata."):
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        node = self._node(inode)
        if name == b"user.strata.cached_bytes" and stat.S_ISREG(node.mode):
            cached = await trio.to_thread.run_sync(self.reader.cached_bytes, node)
            return str(cached).encode()
        value = self._xattrs(node).get(name)
        if value is None:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        return value

    @boundary
    async def listxattr(self, inode: int, ctx: pyfuse3.RequestContext) -> list[bytes]:
        node = self._node(inode)
        names = list(self._xattrs(node))
        if stat.S_ISREG(node.mode):
            names.append(b"user.strata.cached_bytes")
        return names

    # -- every mutation: read-only filesystem ------------------------------------------------

    async def _erofs(self, *args: object, **kwargs: object) -> None:
        raise pyfuse3.FUSEError(errno.EROFS)

    setattr = mknod = mkdir = unlink = rmdir = symlink = rename = link = _erofs  # type: ignore[assignment]
    write = create = setxattr = removexattr = _erofs  # type: ignore[assignment]
