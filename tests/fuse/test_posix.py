"""The mount behaves like a read-only POSIX filesystem (kernel-level tests)."""

from __future__ import annotations

import errno
import mmap
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from deploy.local import LocalStack, drop_page_cache
from fusemount.kernelknobs import MAX_BACKGROUND
from tests.support import eventually, publish, requires_fuse

pytestmark = [pytest.mark.fuse, requires_fuse]

BLOCK = 65_536
MANY = 100_000


@dataclass
class Tree:
    src: Path
    mnt: Path
    cache: Path

    @property
    def v1(self) -> Path:
        return self.mnt / "ds" / "v1"


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tree]:
    tmp = tmp_path_factory.mktemp("posix")
    src = tmp / "src"
    (src / "many").mkdir(parents=True)
    for i in range(MANY):
        (src / "many" / f"e{i:06d}").touch()
    (src / "sub").mkdir()
    (src / "sub" / "inner.txt").write_text("inner\n")
    (src / "rel-link").symlink_to("sub/inner.txt")
    (src / "dir-link").symlink_to("sub")
    np.arange(100_000, dtype=np.float32).tofile(src / "array.f32")
    (src / "data.bin").write_bytes(os.urandom(3 * BLOCK + 77))
    (src / "zero").touch()
    os.chmod(src / "sub" / "inner.txt", 0o640)
    assert publish(tmp / "hub", "ds", src, "--block-size", str(BLOCK)) == "v1"
    with LocalStack() as stack:
        hub = stack.start_hub(tmp / "hub")
        stack.start_spoke(hub, tmp / "cache", tmp / "mnt", "64MiB")
        yield Tree(src, tmp / "mnt", tmp / "cache")


def _xattr(path: Path, name: str) -> str:
    return os.getxattr(path, name).decode()


def _drop_dentries() -> None:
    if not drop_page_cache(2):  # dentries and inodes: FORGETs
        pytest.skip("cannot drop kernel caches (not root)")


def test_o_direct_reads(tree: Tree) -> None:
    data = (tree.src / "data.bin").read_bytes()
    fd = os.open(tree.v1 / "data.bin", os.O_RDONLY | os.O_DIRECT)
    try:
        buf = mmap.mmap(-1, 2 * BLOCK)  # page-aligned buffer
        n = os.preadv(fd, [buf], BLOCK)
        assert n == 2 * BLOCK and buf[:] == data[BLOCK : 3 * BLOCK]
        assert os.pread(fd, 4096, len(data) - 10) == data[-10:]
    finally:
        os.close(fd)


def test_mmap_with_numpy_memmap(tree: Tree) -> None:
    arr = np.memmap(tree.v1 / "array.f32", dtype=np.float32, mode="r")
    assert arr.shape == (100_000,)
    assert float(arr[12_345]) == 12_345.0 and float(arr[-1]) == 99_999.0
    assert np.array_equal(arr, np.fromfile(tree.src / "array.f32", dtype=np.float32))


def test_zero_length_and_eof(tree: Tree) -> None:
    assert (tree.v1 / "zero").read_bytes() == b""
    fd = os.open(tree.v1 / "zero", os.O_RDONLY)
    try:
        assert os.pread(fd, 10, 0) == b"" and os.pread(fd, 10, 1000) == b""
    finally:
        os.close(fd)


def test_symlinks_inside_snapshots(tree: Tree) -> None:
    assert os.readlink(tree.v1 / "rel-link") == "sub/inner.txt"
    assert (tree.v1 / "rel-link").read_text() == "inner\n"
    assert (tree.v1 / "dir-link" / "inner.txt").read_text() == "inner\n"
    assert os.lstat(tree.v1 / "dir-link").st_nlink == 1


def test_modes_from_the_manifest_and_write_flags(tree: Tree) -> None:
    st = os.stat(tree.v1 / "sub" / "inner.txt")
    assert st.st_mode & 0o7777 == 0o640
    with pytest.raises(OSError) as info:
        os.open(tree.v1 / "sub" / "inner.txt", os.O_RDWR)
    assert info.value.errno == errno.EROFS
    with pytest.raises(OSError) as info:
        os.open(tree.v1 / "zero", os.O_WRONLY | os.O_APPEND)
    assert info.value.errno == errno.EROFS


def test_hundred_thousand_entries_listed_in_pages(tree: Tree) -> None:
    expected = sorted(p.name for p in (tree.src / "many").iterdir())
    first = [e.name for e in os.scandir(tree.v1 / "many")]  # many getdents pages
    second = [e.name for e in os.scandir(tree.v1 / "many")]
    assert len(first) == MANY and sorted(first) == expected
    assert first == second  # offsets stable: the same order every time
    ls = subprocess.run(
        ["ls", "-l", str(tree.v1 / "many")], capture_output=True, text=True, check=True
    )
    assert len(ls.stdout.splitlines()) == MANY + 1  # "total" line
    found = subprocess.run(
        ["find", str(tree.v1 / "many"), "-type", "f"], capture_output=True, text=True, check=True
    )
    assert len(found.stdout.splitlines()) == MANY


def test_inodes_and_link_counts_stable(tree: Tree) -> None:
    paths = [tree.v1 / "sub", tree.v1 / "sub" / "inner.txt", tree.v1 / "data.bin", tree.v1]
    before = [(os.lstat(p).st_ino, os.lstat(p).st_nlink) for p in paths]
    _drop_dentries()
    after = [(os.lstat(p).st_ino, os.lstat(p).st_nlink) for p in paths]
    assert before == after
    assert os.stat(tree.v1 / "sub").st_nlink == 2  # no subdirectories
    assert os.stat(tree.v1 / "data.bin").st_nlink == 1
    assert len({ino for ino, _ in before}) == len(paths)


def test_statfs(tree: Tree) -> None:
    vfs = os.statvfs(tree.v1)
    assert vfs.f_namemax == 255 and vfs.f_bsize > 0
    # no count of loaded inodes: it told one pod what the node's others walked
    assert vfs.f_files == vfs.f_ffree == 0


def test_the_connection_keeps_its_background_requests_apart(tree: Tree) -> None:
    """The kernel queues FUSE background requests (readahead) past max_background in
    arrival order, every reader's together: 12 by default kept one team's misses behind
    another's 16 readers (issue 39's nineteenth probe). The mount raises it."""
    minor = os.minor(os.stat(tree.v1).st_dev)
    folder = Path(f"/sys/fs/fuse/connections/{minor}")
    if not folder.is_dir():
        pytest.skip("no FUSE control file system at /sys/fs/fuse/connections")
    eventually(
        lambda: (folder / "max_background").read_text().strip() == str(MAX_BACKGROUND),
        "the mount to raise max_background",
    )
    assert (folder / "congestion_threshold").read_text().strip() == str(MAX_BACKGROUND * 3 // 4)


def test_xattrs(tree: Tree) -> None:
    sid = _xattr(tree.v1, "user.strata.snapshot_id")
    assert len(sid) == 32 and _xattr(tree.v1, "user.strata.version") == "v1"
    f = tree.v1 / "sub" / "inner.txt"
    assert _xattr(f, "user.strata.snapshot_id") == sid
    assert "user.strata.cached_bytes" in os.listxattr(f)
    data = tree.v1 / "data.bin"
    data.read_bytes()
    assert int(_xattr(data, "user.strata.cached_bytes")) == os.stat(data).st_size
    with pytest.raises(OSError) as info:
        os.getxattr(f, "user.nope")
    assert info.value.errno == errno.ENODATA


def test_lookups_are_balanced_by_forget(tree: Tree) -> None:
    def listing() -> None:
        subprocess.run(["find", str(tree.v1)], capture_output=True, check=True)

    listing()
    _drop_dentries()
    inodes = int(_xattr(tree.mnt, "user.strata.inodes"))
    for _ in range(3):
        listing()
        _drop_dentries()
    assert int(_xattr(tree.mnt, "user.strata.inodes")) == inodes  # no new inodes
    refs = [int(_xattr(tree.mnt, "user.strata.kernel_refs"))]

    def let_go() -> bool:  # FORGETs arrive asynchronously after the drop: drop again
        if refs[-1] >= 50:
            _drop_dentries()
            refs.append(int(_xattr(tree.mnt, "user.strata.kernel_refs")))
        return refs[-1] < 50

    # the kernel let go of the 100,000 entries it listed
    eventually(let_go, lambda: f"kernel refs {refs[-1]}, not under 50", 20, interval=0.2)
