"""Python FUSE's floor: the least a pyfuse3 file system can do to serve a directory read-only.

    python -m bench.floorfs SOURCE_DIR MOUNTPOINT [--read-ahead-kb 1024]

Benchmarks mount it over the same files as Strata and run the same jobs, so the distance
between the warm Strata mount and what any Python FUSE file system can reach on this
machine is a number (docs/design.md's target: every fio job ≥ 0.8× this floor). It is modelled on
pyfuse3's ``examples/passthroughfs.py``, cut to the read-only handlers: inode numbers are
the source's, every read is one ``os.pread`` on the event loop (no thread, no checks), and
it is given what Strata gets from the kernel — the same mount options, ``keep_cache``, hour-long
attribute timeouts, the same ``read_ahead_kb`` and the same worker-task counts.

:class:`FloorMount` runs it in a child process for a benchmark (never mount it from the
process that serves it: it would wait on itself).
"""

from __future__ import annotations

import argparse
import errno
import os
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import pyfuse3
import trio

from deploy.local import stop_process
from fusemount.cli import mount_options
from fusemount.kernelknobs import set_read_ahead
from spoke.disk.mountinfo import is_mounted, lazy_unmount

TIMEOUT = 3600.0  # seconds: the tree does not change under a benchmark


class FloorOperations(pyfuse3.Operations):  # type: ignore[misc]
    """Read-only passthrough of ``source``: lookups, attributes, listings and reads.

    Args:
        source: the directory served.
    """

    def __init__(self, source: Path) -> None:
        super().__init__()
        self._paths: dict[int, str] = {pyfuse3.ROOT_INODE: str(source)}
        self._fds: dict[int, int] = {}

    def _path(self, inode: int) -> str:
        try:
            return self._paths[inode]
        except KeyError:
            raise pyfuse3.FUSEError(errno.ENOENT) from None

    def _attr(self, st: os.stat_result, inode: int) -> pyfuse3.EntryAttributes:
        attr = pyfuse3.EntryAttributes()
        for name in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_blocks"):
            setattr(attr, name, getattr(st, name))
        attr.st_ino = inode
        attr.st_blksize = 128 * 1024
        attr.st_atime_ns = attr.st_mtime_ns = attr.st_ctime_ns = st.st_mtime_ns
        attr.entry_timeout = attr.attr_timeout = TIMEOUT
        return attr

    def _stat(self, path: str) -> tuple[os.stat_result, int]:
        try:
            st = os.lstat(path)
        except OSError as err:
            raise pyfuse3.FUSEError(err.errno) from None
        inode = pyfuse3.ROOT_INODE if path == self._paths[pyfuse3.ROOT_INODE] else st.st_ino
        self._paths[inode] = path
        return st, inode

    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        st, inode = self._stat(os.path.join(self._path(parent_inode), os.fsdecode(name)))
        return self._attr(st, inode)

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        st, _ = self._stat(self._path(inode))
        return self._attr(st, inode)

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        return inode

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        path = self._path(fh)
        names = sorted(os.listdir(path))
        for i in range(start_id, len(names)):
            st, inode = self._stat(os.path.join(path, names[i]))
            attr = self._attr(st, inode)
            if not pyfuse3.readdir_reply(token, os.fsencode(names[i]), attr, i + 1):
                break

    async def releasedir(self, fh: int) -> None:
        return None

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise pyfuse3.FUSEError(errno.EROFS)
        fd = os.open(self._path(inode), os.O_RDONLY)
        self._fds[fd] = inode
        return pyfuse3.FileInfo(fh=fd, keep_cache=True)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        return os.pread(fh, size, off)

    async def release(self, fh: int) -> None:
        self._fds.pop(fh, None)
        os.close(fh)

    async def forget(self, inode_list: list[tuple[int, int]]) -> None:
        return None


class FloorMount:
    """The floor file system over ``source`` at ``mount``, in a child process.

    Args:
        source: the directory to serve.
        mount: an empty directory.
        log: where the child's output goes.
    """

    def __init__(self, source: Path, mount: Path, log: Path) -> None:
        self.source = source
        self.mount = mount
        self.log = log
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> FloorMount:
        self.mount.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "bench.floorfs", str(self.source), str(self.mount)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 30
        while not is_mounted(self.mount):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__(None, None, None)
                raise RuntimeError(f"the floor file system did not mount; see {self.log}")
            time.sleep(0.05)
        time.sleep(0.5)  # read_ahead_kb is set 0.3 s after the session starts
        return self

    @property
    def pid(self) -> int | None:
        """Process id of the serving process (None when stopped)."""
        return self._proc.pid if self._proc is not None else None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if is_mounted(self.mount):
            lazy_unmount(self.mount)
        if self._proc is not None:
            stop_process(self._proc)
            self._proc = None


async def _serve(mountpoint: Path, read_ahead_kb: int) -> None:
    async with trio.open_nursery() as nursery:
        if read_ahead_kb > 0:

            async def raise_read_ahead() -> None:
                await trio.sleep(0.3)  # as fusemount.cli: after the INIT reply
                await trio.to_thread.run_sync(set_read_ahead, mountpoint, read_ahead_kb)

            nursery.start_soon(raise_read_ahead)
        await pyfuse3.main(min_tasks=4, max_tasks=64)  # as fusemount.cli
        nursery.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> int:
    """Entry point: serve until unmounted (``fusermount3 -u``) or SIGTERM; 2 on bad input."""
    parser = argparse.ArgumentParser(prog="python -m bench.floorfs", description=__doc__)
    parser.add_argument("source", type=Path)
    parser.add_argument("mountpoint", type=Path)
    parser.add_argument("--read-ahead-kb", type=int, default=1024)
    ns = parser.parse_args(argv)
    source, mountpoint = ns.source.resolve(), ns.mountpoint.resolve()
    for path in (source, mountpoint):
        if not path.is_dir():
            print(f"bench.floorfs: error: {path} is not a directory", file=sys.stderr)
            return 2
    options = mount_options() - {"fsname=strata", "subtype=strata"} | {"fsname=floor"}
    pyfuse3.init(FloorOperations(source), str(mountpoint), options)
    try:
        trio.run(_serve, mountpoint, ns.read_ahead_kb)
    finally:
        pyfuse3.close(unmount=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
