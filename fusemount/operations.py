"""pyfuse3 ``Operations`` for Strata's read-only tree.

The class translates kernel requests into lookups in the namespace (listings, snapshot
trees, revocation: :mod:`fusemount.namespace`) and reads through the block reader; it owns
no bytes. Every handler goes through :func:`boundary`. Opens of cached one-block files may
be handed to the kernel (FUSE passthrough: :mod:`fusemount.passthrough`).

File handles carry their inode and whether the open is passthrough (:func:`file_handle`),
so a process that resumes the FUSE connection (:mod:`spoke.disk.handover`) serves and
releases handles its predecessor opened; inodes it has not seen are found through the
inode journal (:meth:`fusemount.tree.InodeTable.pending_root`).

Kernel caching: snapshot trees are immutable, so their entries and attributes are cached
for an hour, negative lookups inside them too, and files open with ``keep_cache``. The root,
dataset directories and tag symlinks can change (new versions, moved tags): one second.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Sequence

import pyfuse3
import trio

from fusemount.boundary import UNEXPECTED_ERRORS, boundary
from fusemount.client import DaemonClient
from fusemount.entries import Listing
from fusemount.handles import Handles, handle_inode
from fusemount.namespace import Namespace
from fusemount.openers import Openers
from fusemount.passthrough import Passthrough
from fusemount.readahead import Readahead
from fusemount.reader import BlockReader
from fusemount.residency import CachedBytes
from fusemount.source import BlockUnavailableError
from fusemount.tree import InodeTable, Node, Role
from spoke.disk.datasetgroups import DATASET_DIR_MODE, DatasetGroups
from strata_local.memory import trim_malloc

log = logging.getLogger(__name__)

SNAPSHOT_TIMEOUT = 3600.0  # seconds: immutable snapshot trees
MUTABLE_TIMEOUT = 1.0  # seconds: root, dataset listings, tag symlinks
BLKSIZE = 128 * 1024

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def readable(mode: int) -> int:
    """``mode`` opened to every uid: read (and execute, where anyone may) for files, read
    and search for directories; symlinks as they are (the kernel ignores their bits)."""
    if stat.S_ISDIR(mode):
        return mode | 0o555
    if stat.S_ISREG(mode):
        return mode | 0o444 | (0o111 if mode & 0o111 else 0)
    return mode


class StrataOperations(pyfuse3.Operations):  # type: ignore[misc]
    """The read-only filesystem ``MOUNT/<dataset>/<version>/…``.

    Twenty-six methods because pyfuse3 calls one per FUSE request it implements (lookup,
    getattr, readdir, open, read, release, xattrs, statfs …); each is a thin handler over
    the tree (:mod:`fusemount.tree`) and the read flow (:mod:`fusemount.source`).

    Args:
        client: the daemon connection (catalog and misses).
        reader: serves file bytes.
        passthrough: which opens the kernel serves itself (default: none).
        inodes: the inode table (default: a new one, not journaled).
        readable_by_all: show snapshot files readable (| 0o444, and | 0o111 where anyone
            may run it) and directories searchable (| 0o555) by any uid.
        uid, gid: the owner every node shows (default: this process's).
        dataset_groups: with rules, every dataset directory shows owner root, the group
            of its dataset and mode 0550 (``--dataset-groups``); nothing below it changes.
    """

    enable_writeback_cache = False
    enable_acl = False

    def __init__(
        self,
        client: DaemonClient,
        reader: BlockReader,
        passthrough: Passthrough | None = None,
        inodes: InodeTable | None = None,
        readable_by_all: bool = False,
        uid: int | None = None,
        gid: int | None = None,
        dataset_groups: DatasetGroups | None = None,
    ) -> None:
        super().__init__()
        self.client = client
        self.reader = reader
        self.inodes = inodes if inodes is not None else InodeTable()
        self.on_init: list[object] = []  # called after FUSE INIT (the hand-over's publish)
        self.namespace = Namespace(client, self.inodes)
        self.passthrough = passthrough or Passthrough("not configured")
        self.namespace.on_revoked = self._revoked
        self.cached_bytes = CachedBytes(str(reader.layout.blocks_dir))
        self.handles = Handles()
        self.openers = Openers()
        self._uid = os.getuid() if uid is None else uid
        self._gid = os.getgid() if gid is None else gid
        self._readable_by_all = readable_by_all
        self._dataset_groups = dataset_groups or None

    # -- attributes ---------------------------------------------------------------

    def _attr(self, node: Node) -> pyfuse3.EntryAttributes:
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = node.inode
        attr.st_mode = readable(node.mode) if self._readable_by_all else node.mode
        attr.st_nlink = node.nlink
        attr.st_size = node.size
        attr.st_uid = self._uid
        attr.st_gid = self._gid
        attr.st_blksize = BLKSIZE
        attr.st_blocks = (node.size + 511) // 512
        attr.st_atime_ns = attr.st_mtime_ns = attr.st_ctime_ns = node.mtime_ns
        if node.role is Role.DATASET and self._dataset_groups is not None:
            # the gate of MOUNT/<dataset> (the kernel checks it: default_permissions)
            attr.st_mode, attr.st_uid = DATASET_DIR_MODE, 0
            attr.st_gid = self._dataset_groups.gid(node.dataset)
        timeout = SNAPSHOT_TIMEOUT if node.role in (Role.ENTRY, Role.VERSION) else MUTABLE_TIMEOUT
        attr.entry_timeout = timeout
        attr.attr_timeout = timeout
        return attr

    @property
    def enable_passthrough(self) -> bool:
        """Read by the patched pyfuse3 at FUSE INIT: request FUSE_CAP_PASSTHROUGH."""
        return self.passthrough.enabled

    def init(self) -> None:
        """Called by pyfuse3 during FUSE INIT: log whether passthrough is on, and why not."""
        state = getattr(pyfuse3, "passthrough_state", None)
        offered, requested = state() if state is not None else (False, False)
        self.passthrough.negotiated(offered, requested)
        for call in self.on_init:
            call()  # type: ignore[operator]

    def _revoked(self) -> None:
        truncated = self.passthrough.revoke(self.namespace.revoked)
        if truncated:
            log.info("revocation: %d evicted block files of passthrough files emptied", truncated)

    async def watch_catalog(self) -> None:
        """Refresh listings in the background until cancelled (see :mod:`fusemount.namespace`)."""
        await self.namespace.refresh_forever()

    async def _node(self, inode: int) -> Node:
        node = self.inodes.get(inode)
        if node is None and self.inodes.pending_root(inode) is None:
            self.inodes.sync()  # perhaps a number another worker just gave out
            node = self.inodes.get(inode)
        if node is None:
            # a number a predecessor or another worker gave out: load its snapshot's tree
            root = self.inodes.pending_root(inode)
            if root is not None:
                await self.namespace.children(root)
                node = self.inodes.get(inode)
        if node is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return node

    # -- handlers -----------------------------------------------------------------------

    @boundary
    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        parent = await self._node(parent_inode)
        self.namespace.check_live(parent)
        if not parent.is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        if name == b".":
            return self._attr(parent)
        children = await self.namespace.children(parent)
        inode = children.get(name)
        if inode is None:
            if parent.role in (Role.VERSION, Role.ENTRY):
                negative = pyfuse3.EntryAttributes()  # st_ino 0: the kernel caches the ENOENT
                negative.st_ino = 0
                negative.entry_timeout = SNAPSHOT_TIMEOUT
                return negative
            raise pyfuse3.FUSEError(errno.ENOENT)
        self.inodes.remember(inode)
        return self._attr(self.inodes[inode])

    @boundary
    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return self._attr(await self._node(inode))

    @boundary
    async def readlink(self, inode: int, ctx: pyfuse3.RequestContext) -> bytes:
        node = await self._node(inode)
        if not stat.S_ISLNK(node.mode):
            raise pyfuse3.FUSEError(errno.EINVAL)
        return node.target

    @boundary
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        node = await self._node(inode)
        if not node.is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        await self.namespace.children(node)
        return inode

    @boundary
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        node = await self._node(fh)
        await self.namespace.children(node)
        names = node.child_names
        children = node.children or {}
        listing = children if isinstance(children, Listing) else None
        for i in range(start_id, len(names)):
            inode = listing.inode_at(i) if listing is not None else children[names[i]]
            child = self.inodes[inode]
            if not pyfuse3.readdir_reply(token, names[i], self._attr(child), i + 1):
                break
            # readdirplus: each entry returned counts as a lookup
            self.inodes.remember(child.inode)

    @boundary
    async def releasedir(self, fh: int) -> None:
        return None

    @boundary
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        node = await self._node(inode)
        self.namespace.check_live(node)
        if flags & _WRITE_FLAGS:
            raise pyfuse3.FUSEError(errno.EROFS)
        if node.is_dir:
            raise pyfuse3.FUSEError(errno.EISDIR)
        opener = self.openers.of(ctx.pid, ctx.uid)
        self.handles.check(opener)  # EMFILE for an opener holding its most
        direct = bool(flags & os.O_DIRECT)
        backing_id = await self._passthrough_open(inode, node, direct)
        if backing_id is None:  # counted on the pyfuse3 path, or an id attached meanwhile
            backing_id = self.passthrough.opened_cached(inode)
        passing = backing_id is not None
        fh = self.handles.open(inode, passing, opener, (node, Readahead(), passing))
        self.reader.opened(node, ctx.pid, self.inodes.files(node.snapshot_id))
        if backing_id is not None:  # the kernel forbids keep_cache with passthrough
            return pyfuse3.FileInfo(  # type: ignore[call-arg]
                fh=fh, keep_cache=False, backing_id=backing_id, direct_io=direct
            )
        return pyfuse3.FileInfo(fh=fh, keep_cache=True)

    async def _passthrough_open(self, inode: int, node: Node, direct: bool) -> int | None:
        """A backing id when this open can be served by the kernel from the block file.

        The block file is opened and verified (as every read of it is) in a worker thread
        before its descriptor is handed to the kernel, unless it is open and verified
        already (then on the loop); a block not cached is fetched first (a miss, as the
        first read's would be), and one that cannot be means the pyfuse3 path.
        The open counts as one hit of the block for the daemon's eviction policy (its
        reads never reach this process).
        """
        # An inode with a backing id shares it, even if passthrough was turned off since:
        # the kernel fails (EIO) an open beside passthrough ones that is not one itself.
        # O_DIRECT never starts passthrough (the backing file system would impose its
        # alignment rules, FUSE has none) and joins it with FOPEN_DIRECT_IO, which sends
        # its reads to this process, as without passthrough.
        backing_id = self.passthrough.shared(inode, not direct, node.snapshot_id)
        if backing_id is not None or direct:
            if backing_id is not None and not direct:
                self.reader.hit_log.add(node.blocks[0][0])
            return backing_id
        digest = self.passthrough.candidate(inode, node)
        if digest is None:
            return None
        fd = self.reader.files.verified_fd_cached(digest)  # re-opens: no thread hop
        if fd is None:
            fd = await trio.to_thread.run_sync(self.reader.files.verified_fd, digest)
        missed = fd is None
        if missed:
            # not cached: fetch it now, as the first read would, so its reads are the
            # kernel's too (a cold Zarr chunk costs this process no byte); a block the
            # daemon could not cache, or a failed fetch, leaves the open to the pyfuse3
            # path, whose read serves the bytes or the error
            try:
                if not await self.reader.source.fetch(digest, node.size):
                    return None
            except BlockUnavailableError:
                return None
            fd = await trio.to_thread.run_sync(self.reader.files.verified_fd, digest)
        if fd is None:
            return None
        backing_id = self.passthrough.attach(inode, node, digest, fd)
        if backing_id is not None and not missed:  # a miss was counted as one by its fetch
            self.reader.hit_log.add(digest)
        return backing_id

    @boundary
    async def read(self, fh: int, off: int, size: int) -> bytes | bytearray:  # type: ignore[override]
        # pyfuse3 replies with any contiguous buffer (PyObject_GetBuffer): no copy to bytes
        handle = self.handles.get(fh)
        if handle is None:  # opened by a predecessor on this connection
            inode, passthrough = handle_inode(fh)
            if self.inodes.get(inode) is None and self.inodes.pending_root(inode) is None:
                self.inodes.sync()  # opened by another worker, in a tree it just loaded
            if self.inodes.get(inode) is None and self.inodes.pending_root(inode) is None:
                raise pyfuse3.FUSEError(errno.EBADF)  # no handle of this connection
            handle = (await self._node(inode), Readahead(), passthrough)
            self.handles.adopt(fh, handle)
        node, readahead, _ = handle
        if node.snapshot_id in self.namespace.revoked:
            raise pyfuse3.FUSEError(errno.EIO)  # open before the revocation: never more bytes
        return await self.reader.read(node, off, size, readahead)

    @boundary
    async def release(self, fh: int) -> None:
        trim = self.handles.release(fh)
        inode, passthrough = handle_inode(fh)  # a predecessor's handle is counted too
        self.passthrough.released(inode, passthrough)
        if trim:  # many handles' state freed: give the heap's free pages back
            await trio.to_thread.run_sync(trim_malloc)

    @boundary
    async def access(self, inode: int, mode: int, ctx: pyfuse3.RequestContext) -> bool:
        await self._node(inode)
        return not mode & os.W_OK

    @boundary
    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        st = pyfuse3.StatvfsData()
        st.f_bsize = BLKSIZE
        st.f_frsize = 4096
        st.f_blocks = 0
        st.f_bfree = st.f_bavail = 0
        # no file count: the mount is every pod's, and the inodes loaded told one pod what
        # the node's others walked (issue 39's nineteenth probe: 5, then 3,007 after
        # another team's reader walked its 3,000 files); statfs names no snapshot
        st.f_files = st.f_ffree = st.f_favail = 0
        st.f_namemax = 255
        return st

    @boundary
    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        # The inode table keeps every number for the life of the mount (numbers stay stable);
        # what forget balances is the kernel's references, so none leak.
        for inode, nlookup in inode_list:
            self.inodes.forget(inode, nlookup)

    @property
    def kernel_refs(self) -> int:
        """Inodes the kernel currently holds a lookup reference to."""
        return self.inodes.kernel_refs

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
            source = self.reader.source
            out[b"user.strata.loop_reads"] = str(source.loop_reads).encode()
            out[b"user.strata.thread_reads"] = str(source.thread_reads).encode()
            out[b"user.strata.hits"] = str(self.reader.hit_log.count).encode()
            pt = self.passthrough
            out[b"user.strata.passthrough"] = b"on" if pt.enabled else f"off: {pt.reason}".encode()
            out[b"user.strata.passthrough_opens"] = str(pt.opens).encode()
            out[b"user.strata.backing_ids"] = str(pt.backing_ids).encode()
            out[b"user.strata.idle_backing_ids"] = str(pt.idle_backing_ids).encode()
            out[b"user.strata.backing_reuses"] = str(pt.reuses).encode()
            out[b"user.strata.backing_descriptors"] = str(pt.descriptors).encode()
            ahead = self.reader.crossfile
            out[b"user.strata.crossfile_windows"] = str(ahead.windows).encode()
            out[b"user.strata.crossfile_blocks"] = str(ahead.blocks).encode()
        return out

    @boundary
    async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
        # ``ls -l`` asks for security.* and system.* names on every file: answer those
        # first, without any work (the hot path of listing large directories).
        if not name.startswith(b"user.strata."):
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        node = await self._node(inode)
        if name == b"user.strata.cached_bytes" and stat.S_ISREG(node.mode):
            return str(await self.cached_bytes.of(node)).encode()
        value = self._xattrs(node).get(name)
        if value is None:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        return value

    @boundary
    async def listxattr(self, inode: int, ctx: pyfuse3.RequestContext) -> list[bytes]:
        node = await self._node(inode)
        names = list(self._xattrs(node))
        if stat.S_ISREG(node.mode):
            names.append(b"user.strata.cached_bytes")
        return names

    # -- every mutation: read-only filesystem ------------------------------------------------

    async def _erofs(self, *args: object, **kwargs: object) -> None:
        raise pyfuse3.FUSEError(errno.EROFS)

    setattr = mknod = mkdir = unlink = rmdir = symlink = rename = link = _erofs  # type: ignore[assignment]
    write = create = setxattr = removexattr = _erofs  # type: ignore[assignment]
