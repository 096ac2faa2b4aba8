"""The read-only mount, for real: a hub and a spoke as processes, a kernel FUSE mount."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from deploy.local import LocalStack, admin_headers, drop_page_cache
from tests.support import (
    all_hits_reported,
    eventually,
    make_tree,
    publish,
    requires_fuse,
    sha256,
    tree_digests,
)

pytestmark = [pytest.mark.fuse, requires_fuse]

BLOCK = "65536"


@dataclass
class Mounted:
    src_v1: Path
    src_v2: Path
    mount: Path
    admin: str
    hub: str
    auth: dict[str, str]  # the admin token the spoke generated


@pytest.fixture(scope="module")
def mounted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mounted]:
    tmp = tmp_path_factory.mktemp("mount")
    v1, v2 = tmp / "v1", tmp / "v2"
    v1.mkdir()
    make_tree(v1)
    shutil.copytree(v1, v2, symlinks=True)
    (v2 / "small.txt").write_text("hello strata, version two\n")
    (v2 / "added.txt").write_text("new in v2\n")
    assert publish(tmp / "hub", "demo", v1, "--block-size", BLOCK) == "v1"
    assert publish(tmp / "hub", "demo", v2, "--block-size", BLOCK) == "v2"
    with LocalStack() as stack:
        hub = stack.start_hub(tmp / "hub")
        admin = stack.start_spoke(hub, tmp / "cache", tmp / "mnt", "64MiB")
        yield Mounted(v1, v2, tmp / "mnt", admin, hub, admin_headers(tmp / "cache"))


def test_every_file_reads_byte_identical(mounted: Mounted) -> None:
    for version, src in (("v1", mounted.src_v1), ("v2", mounted.src_v2)):
        root = mounted.mount / "demo" / version
        assert tree_digests(root) == tree_digests(src), version


def test_two_versions_side_by_side(mounted: Mounted) -> None:
    m = mounted.mount / "demo"
    assert (m / "v1" / "small.txt").read_text() == "hello strata\n"
    assert (m / "v2" / "small.txt").read_text() == "hello strata, version two\n"
    assert not (m / "v1" / "added.txt").exists()
    assert sha256(m / "v1" / "big.bin") == sha256(m / "v2" / "big.bin")


def test_tag_is_a_symlink_to_the_version(mounted: Mounted) -> None:
    latest = mounted.mount / "demo" / "latest"
    assert latest.is_symlink()
    assert os.readlink(latest) == "v2"
    assert (latest / "added.txt").read_text() == "new in v2\n"
    assert sorted(os.listdir(mounted.mount / "demo")) == ["latest", "v1", "v2"]


def test_ls_find_stat(mounted: Mounted) -> None:
    root = mounted.mount / "demo" / "v1"
    ls = subprocess.run(["ls", "-la", str(root)], capture_output=True, text=True, check=True)
    assert "big.bin" in ls.stdout and "link-to-small -> small.txt" in ls.stdout
    found = subprocess.run(["find", str(root)], capture_output=True, text=True, check=True)
    names = {str(Path(p).relative_to(root)) for p in found.stdout.split() if p != str(root)}
    expected = {str(p.relative_to(mounted.src_v1)) for p in mounted.src_v1.rglob("*")}
    assert names == expected
    st, src_st = os.stat(root / "big.bin"), os.stat(mounted.src_v1 / "big.bin")
    assert st.st_size == src_st.st_size
    assert st.st_mode == src_st.st_mode
    assert st.st_mtime_ns == src_st.st_mtime_ns
    assert os.stat(root / "empty.bin").st_size == 0
    assert (root / "empty-dir").is_dir() and os.listdir(root / "empty-dir") == []
    assert os.readlink(root / "link-to-small") == "small.txt"
    assert (root / "link-to-small").read_text() == "hello strata\n"
    vfs = os.statvfs(root)
    assert vfs.f_namemax == 255


def test_writes_get_erofs(mounted: Mounted) -> None:
    root = mounted.mount / "demo" / "v1"
    for flags in (os.O_WRONLY, os.O_RDWR, os.O_WRONLY | os.O_CREAT | os.O_TRUNC):
        with pytest.raises(OSError) as info:
            os.open(root / "small.txt", flags)
        assert info.value.errno == errno.EROFS
    with pytest.raises(OSError) as info:
        (root / "new.txt").write_text("nope")
    assert info.value.errno == errno.EROFS
    with pytest.raises(OSError) as info:
        os.mkdir(root / "newdir")
    assert info.value.errno == errno.EROFS
    with pytest.raises(OSError) as info:
        os.unlink(root / "small.txt")
    assert info.value.errno == errno.EROFS


def test_missing_paths_get_enoent(mounted: Mounted) -> None:
    for missing in ("nope", "demo/v9", "demo/v1/nope.txt", "demo/v1/nested/nope"):
        with pytest.raises(FileNotFoundError):
            os.stat(mounted.mount / missing)


def test_pread_at_and_past_eof(mounted: Mounted) -> None:
    path = mounted.mount / "demo" / "v1" / "big.bin"
    data = (mounted.src_v1 / "big.bin").read_bytes()
    fd = os.open(path, os.O_RDONLY)
    try:
        assert os.pread(fd, 100, len(data) - 10) == data[-10:]
        assert os.pread(fd, 100, len(data)) == b""
        assert os.pread(fd, 100, len(data) + 5000) == b""
        assert os.pread(fd, 70_000, 60_000) == data[60_000:130_000]  # spans three blocks
    finally:
        os.close(fd)


def test_second_read_is_a_hit_and_fetches_nothing(mounted: Mounted) -> None:
    path = mounted.mount / "demo" / "v2" / "nested" / "deeper" / "b.bin"
    path.read_bytes()
    all_hits_reported(  # the mount reports hits in batches (every 0.1 s or 1024 hits)
        mounted.mount,
        lambda: httpx.get(f"{mounted.admin}/v1/cache", headers=mounted.auth).json()["hits"],
    )
    before = httpx.get(f"{mounted.admin}/v1/cache", headers=mounted.auth).json()
    if not drop_page_cache():  # so the read reaches the mount
        pytest.skip("cannot drop the kernel page cache (not root)")
    assert path.read_bytes() == (mounted.src_v2 / "nested" / "deeper" / "b.bin").read_bytes()
    after = eventually(
        lambda: (
            (now := httpx.get(f"{mounted.admin}/v1/cache", headers=mounted.auth).json())["hits"]
            > before["hits"]
            and now
        ),
        "the second read's hit reported",
        5,
    )
    assert after["hits"] > before["hits"]
    assert after["hub_fetch_bytes"] == before["hub_fetch_bytes"]
    assert after["misses"] == before["misses"]


def test_cli_status(mounted: Mounted) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "spoke",
            "status",
            "--cache-dir",
            str(mounted.mount.parent / "cache"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert '"hub_fetch_bytes"' in out.stdout
