"""FUSE passthrough through a real mount: cached one-block files are read by the kernel.

Skipped, with the reason printed, where pyfuse3 lacks the calls (not built by ``make``),
the process lacks CAP_SYS_ADMIN or the kernel does not offer passthrough; under CI (``$CI``
set) a pyfuse3 without them fails instead, since ``make`` builds it there.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from deploy.local import LocalStack
from fusemount.passthroughcheck import has_cap_sys_admin, library_supports
from spoke.disk.layout import CacheLayout
from tests.support import eventually_ok, publish, requires_fuse

pytestmark = [pytest.mark.fuse, requires_fuse]

BLOCK = 65_536


def _static_reason() -> str | None:
    if not library_supports():
        return "pyfuse3 was built without passthrough (make setup builds it on libfuse 3.17)"
    if not has_cap_sys_admin():
        return "no CAP_SYS_ADMIN: the kernel registers backing files only for it"
    return None


@pytest.fixture
def passthrough() -> None:
    """Skip (print why) where this process cannot use passthrough at all."""
    reason = _static_reason()
    if reason is None:
        return
    if os.environ.get("CI") and not library_supports():
        pytest.fail(reason)  # make builds the library on CI: never pass by skipping
    print(f"skipped: {reason}")
    pytest.skip(reason)


def _xattr(mnt: Path, name: str) -> str:
    return os.getxattr(mnt, f"user.strata.{name}").decode()


def _state(mnt: Path) -> str:
    state = _xattr(mnt, "passthrough")
    if state.startswith("off: the kernel"):
        print(f"skipped: {state}")
        pytest.skip(state)
    assert state == "on", state
    return state


def _mount_reads(mnt: Path) -> int:
    return int(_xattr(mnt, "loop_reads")) + int(_xattr(mnt, "thread_reads"))


def _within(seconds: float, cond: Callable[[], bool]) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds} s")
        time.sleep(0.05)


@pytest.fixture
def stack() -> Iterator[LocalStack]:
    with LocalStack() as s:
        yield s


ONE_BLOCK = {"tiny.txt": 13, "chunk.bin": BLOCK, "part.bin": 40_000, "byte.bin": 1}
MULTI = {"multi.bin": 5 * BLOCK + 123, "edge.bin": BLOCK + 1}


@pytest.fixture
def src(tmp_path: Path) -> Path:
    rng = random.Random(7)
    root = tmp_path / "src"
    (root / "sub").mkdir(parents=True)
    for name, size in {**ONE_BLOCK, **MULTI}.items():
        (root / "sub" / name).write_bytes(rng.randbytes(size))
    (root / "empty.bin").write_bytes(b"")
    assert publish(tmp_path / "hub", "ds", root, "--block-size", str(BLOCK)) == "v1"
    return root


def _warm(v1: Path, src: Path) -> None:
    """First reads fetch every block (a one-block file's open fetches it, then passes it
    through; the others take the pyfuse3 path)."""
    for path in sorted(src.rglob("*")):
        if path.is_file():
            assert (v1 / path.relative_to(src)).read_bytes() == path.read_bytes()


@pytest.mark.usefixtures("passthrough")
def test_cached_one_block_files_are_read_by_the_kernel_byte_for_byte(
    tmp_path: Path, src: Path, stack: LocalStack
) -> None:
    hub = stack.start_hub(tmp_path / "hub")
    mnt = tmp_path / "mnt"
    stack.start_spoke(hub, tmp_path / "cache", mnt, "64MiB")
    _state(mnt)
    v1 = mnt / "ds" / "v1"
    _warm(v1, src)
    opens_before = int(_xattr(mnt, "passthrough_opens"))
    reads_before = _mount_reads(mnt)
    rng = random.Random(1)
    fds = {name: os.open(v1 / "sub" / name, os.O_RDONLY) for name in ONE_BLOCK}
    try:
        assert int(_xattr(mnt, "passthrough_opens")) == opens_before + len(ONE_BLOCK)
        assert int(_xattr(mnt, "backing_ids")) == len(ONE_BLOCK)
        again = os.open(v1 / "sub" / "chunk.bin", os.O_RDONLY)  # a second handle shares the id
        assert int(_xattr(mnt, "backing_ids")) == len(ONE_BLOCK)
        os.close(again)
        direct = os.open(v1 / "sub" / "tiny.txt", os.O_RDONLY | os.O_DIRECT)  # beside them
        try:  # not passed through: FUSE's O_DIRECT has no alignment rules, ext4's has
            assert os.pread(direct, 4096, 0) == (src / "sub" / "tiny.txt").read_bytes()
        finally:
            os.close(direct)
        reads_before = _mount_reads(mnt)
        for name, fd in fds.items():
            want = (src / "sub" / name).read_bytes()
            assert os.pread(fd, len(want) + 10, 0) == want  # sequential, whole file, EOF
            for _ in range(200):  # random ranges, some past the end
                off = rng.randrange(0, len(want) + 100)
                size = rng.choice((1, 512, 4096, 10_000, BLOCK))
                assert os.pread(fd, size, off) == want[off : off + size], (name, off, size)
        assert _mount_reads(mnt) == reads_before  # not one read reached the mount
    finally:
        for fd in fds.values():
            os.close(fd)
    # released: the ids stay registered, idle, for the next opens of these inodes
    _within(5, lambda: int(_xattr(mnt, "idle_backing_ids")) == len(ONE_BLOCK))
    assert int(_xattr(mnt, "backing_ids")) == len(ONE_BLOCK)
    reuses, opens = int(_xattr(mnt, "backing_reuses")), int(_xattr(mnt, "passthrough_opens"))
    for name in ONE_BLOCK:  # re-opened: the idle id serves them, nothing registered
        assert (v1 / "sub" / name).read_bytes() == (src / "sub" / name).read_bytes()
    assert int(_xattr(mnt, "backing_reuses")) == reuses + len(ONE_BLOCK)
    assert int(_xattr(mnt, "passthrough_opens")) == opens + len(ONE_BLOCK)
    assert int(_xattr(mnt, "backing_ids")) == len(ONE_BLOCK)
    assert _mount_reads(mnt) == reads_before

    # multi-block and empty files stay on the pyfuse3 path, bytes identical too
    opens = int(_xattr(mnt, "passthrough_opens"))
    for name in MULTI:
        want = (src / "sub" / name).read_bytes()
        with open(v1 / "sub" / name, "rb", buffering=0) as f:
            for _ in range(50):
                off = rng.randrange(0, len(want))
                f.seek(off)
                assert f.read(4096) == want[off : off + 4096]
    assert (v1 / "empty.bin").read_bytes() == b""
    assert int(_xattr(mnt, "passthrough_opens")) == opens


@pytest.mark.usefixtures("passthrough")
def test_a_cold_one_block_file_is_fetched_at_open_and_read_by_the_kernel(
    tmp_path: Path, src: Path, stack: LocalStack
) -> None:
    """Issue 40 item 4: a cold Zarr chunk costs the mount no byte: its open fetches the
    block (the miss its first read would have been) and passes the block file through."""
    hub = stack.start_hub(tmp_path / "hub")
    mnt = tmp_path / "mnt"
    stack.start_spoke(hub, tmp_path / "cache", mnt, "64MiB", extra=("--background-fill", "off"))
    _state(mnt)
    v1 = mnt / "ds" / "v1"
    for name in ONE_BLOCK:
        os.stat(v1 / "sub" / name)  # the tree is loaded: nothing cached yet
    opens = int(_xattr(mnt, "passthrough_opens"))
    reads = _mount_reads(mnt)
    for name in ONE_BLOCK:
        assert (v1 / "sub" / name).read_bytes() == (src / "sub" / name).read_bytes()
    assert int(_xattr(mnt, "passthrough_opens")) == opens + len(ONE_BLOCK)
    assert _mount_reads(mnt) == reads, "every byte came from the kernel"
    # a multi-block file stays on the pyfuse3 path, cold or not
    assert (v1 / "sub" / "multi.bin").read_bytes() == (src / "sub" / "multi.bin").read_bytes()
    assert int(_xattr(mnt, "passthrough_opens")) == opens + len(ONE_BLOCK)


def _hub(data_dir: Path, *args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "hub", *args, "--data-dir", str(data_dir)],
        check=True,
        capture_output=True,
    )


@pytest.mark.usefixtures("passthrough")
def test_a_revoked_versions_open_passthrough_file_stops_returning_data(tmp_path: Path) -> None:
    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    for src, seed in ((v1, b"one"), (v2, b"two")):
        src.mkdir()
        (src / "shared.bin").write_bytes(b"s" * 50_000)  # the same block in both versions
        (src / "own.bin").write_bytes(seed * 20_000)  # v1's own block
    hub_dir = tmp_path / "hub"
    assert publish(hub_dir, "ds", v1, "--block-size", str(BLOCK)) == "v1"
    with LocalStack() as stack:
        hub = stack.start_hub(hub_dir)
        mnt = tmp_path / "mnt"
        stack.start_spoke(hub, tmp_path / "cache", mnt, "64MiB")
        _state(mnt)
        ds = mnt / "ds"
        _warm(ds / "v1", v1)
        own = os.open(ds / "v1" / "own.bin", os.O_RDONLY)
        shared = os.open(ds / "v1" / "shared.bin", os.O_RDONLY)
        try:
            assert int(_xattr(mnt, "backing_ids")) == 2  # both passthrough
            assert os.pread(own, 100, 0) == (v1 / "own.bin").read_bytes()[:100]
            assert publish(hub_dir, "ds", v2, "--block-size", str(BLOCK)) == "v2"
            _within(3, lambda: "v2" in os.listdir(ds))
            assert (ds / "v2" / "shared.bin").read_bytes() == (v2 / "shared.bin").read_bytes()
            _hub(hub_dir, "revoke", "ds", "v1")
            _within(3, lambda: "v1" not in os.listdir(ds))
            # v1's own block was emptied by the daemon's purge: its reader sees end-of-file
            _within(3, lambda: os.pread(own, 100, 0) == b"")
            assert os.pread(own, 4096, 8192) == b""
            # the documented gap: a block shared with a live version is that version's data
            assert os.pread(shared, 100, 0) == (v2 / "shared.bin").read_bytes()[:100]
        finally:
            os.close(own)
            os.close(shared)
        assert (ds / "v2" / "shared.bin").read_bytes() == (v2 / "shared.bin").read_bytes()


@pytest.mark.usefixtures("passthrough")
def test_kill_9_of_mount_or_daemon_with_passthrough_files_open(
    tmp_path: Path, src: Path, stack: LocalStack
) -> None:
    hub = stack.start_hub(tmp_path / "hub")
    cache, mnt = tmp_path / "cache", tmp_path / "mnt"
    stack.start_spoke(hub, cache, mnt, "64MiB")
    _state(mnt)
    v1 = mnt / "ds" / "v1"
    _warm(v1, src)
    want = (src / "sub" / "chunk.bin").read_bytes()
    layout = CacheLayout(cache)
    fd = os.open(v1 / "sub" / "chunk.bin", os.O_RDONLY)
    try:  # one id in use (others the warm-up's opens left idle)
        assert int(_xattr(mnt, "backing_ids")) - int(_xattr(mnt, "idle_backing_ids")) == 1
        daemon = int(layout.daemon_pid_file.read_text())
        os.kill(daemon, signal.SIGKILL)  # the mount stays; the kernel reads on
        assert os.pread(fd, BLOCK, 0) == want
        with open(v1 / "sub" / "part.bin", "rb") as f:  # new opens too (cached, verified)
            assert f.read() == (src / "sub" / "part.bin").read_bytes()
        mount = int(layout.mount_pid_file.read_text())
        os.kill(mount, signal.SIGKILL)
        # the open file keeps the kernel's reference to its verified block file
        assert os.pread(fd, 4096, 4096) == want[4096:8192]
        _within(30, lambda: _pid(layout.mount_pid_file) not in (None, mount))
    finally:
        os.close(fd)
    # a reader that retries succeeds once the supervisor has remounted
    got = eventually_ok((v1 / "sub" / "chunk.bin").read_bytes, "a read after the remount")
    assert got == want
    assert int(_xattr(mnt, "passthrough_opens")) >= 1  # the new mount passes through again


def _pid(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def test_passthrough_off_keeps_every_read_on_the_pyfuse3_path(
    tmp_path: Path, src: Path, stack: LocalStack
) -> None:
    hub = stack.start_hub(tmp_path / "hub")
    mnt = tmp_path / "mnt"
    stack.start_spoke(hub, tmp_path / "cache", mnt, "64MiB", extra=("--passthrough", "off"))
    assert _xattr(mnt, "passthrough") == "off: --passthrough off"
    v1 = mnt / "ds" / "v1"
    _warm(v1, src)
    _warm(v1, src)
    assert _xattr(mnt, "passthrough_opens") == "0"


@pytest.mark.usefixtures("passthrough")
def test_encrypted_block_files_are_never_passed_through(
    tmp_path: Path, src: Path, stack: LocalStack
) -> None:
    from spoke.disk.encryption import write_key

    key = tmp_path / "cache.key"
    write_key(key)
    hub = stack.start_hub(tmp_path / "hub")
    mnt = tmp_path / "mnt"
    flags = ("--encryption-key-file", str(key))
    stack.start_spoke(hub, tmp_path / "cache", mnt, "64MiB", extra=flags, admin_token=True)
    assert _xattr(mnt, "passthrough").startswith("off: block files are encrypted")
    v1 = mnt / "ds" / "v1"
    _warm(v1, src)
    _warm(v1, src)  # cached now: still the pyfuse3 path, which decrypts
    assert _xattr(mnt, "passthrough_opens") == "0"


@pytest.mark.usefixtures("passthrough")
def test_parallel_opens_of_cached_files_share_ids_and_read_identical_bytes(
    tmp_path: Path, stack: LocalStack
) -> None:
    rng = random.Random(3)
    root = tmp_path / "many"
    root.mkdir()
    want = {f"c{i:03d}": rng.randbytes(rng.randrange(1, BLOCK + 1)) for i in range(64)}
    for name, data in want.items():
        (root / name).write_bytes(data)
    assert publish(tmp_path / "hub", "many", root, "--block-size", str(BLOCK)) == "v1"
    hub = stack.start_hub(tmp_path / "hub")
    mnt = tmp_path / "mnt"
    stack.start_spoke(hub, tmp_path / "cache", mnt, "64MiB")
    _state(mnt)
    v1 = mnt / "many" / "v1"
    for name, data in want.items():  # fetched, then opened once with passthrough
        assert (v1 / name).read_bytes() == data
        assert (v1 / name).read_bytes() == data
    registered = int(_xattr(mnt, "backing_ids"))
    reuses = int(_xattr(mnt, "backing_reuses"))
    wrong: list[str] = []

    def reader(seed: int) -> None:
        names = random.Random(seed).sample(sorted(want), len(want))
        for name in names * 5:
            fd = os.open(v1 / name, os.O_RDONLY)
            try:
                if os.pread(fd, BLOCK + 1, 0) != want[name]:
                    wrong.append(name)
            finally:
                os.close(fd)

    threads = [threading.Thread(target=reader, args=(seed,)) for seed in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []
    # every open was passthrough on an id registered before: none registered meanwhile
    assert int(_xattr(mnt, "backing_ids")) == registered == len(want)
    assert int(_xattr(mnt, "backing_reuses")) > reuses
    _within(5, lambda: int(_xattr(mnt, "idle_backing_ids")) == len(want))


@pytest.mark.usefixtures("passthrough")
def test_opens_of_more_cached_files_than_keep_descriptors_reuse_their_ids_and_leak_nothing(
    tmp_path: Path, stack: LocalStack
) -> None:
    """The mount under an open-file limit of 4,096 keeps descriptors for 2,048 idle backing
    ids; 2,400 cached one-block files opened in a loop keep all 2,400 ids registered (the
    older ones without a descriptor, opened again by path), read byte for byte, with no
    new registration after the first pass and no descriptor or id left over."""
    rng = random.Random(11)
    root = tmp_path / "src"
    files = {}
    for d in range(8):
        (root / f"d{d}").mkdir(parents=True)
        for i in range(300):
            name = f"d{d}/f{i}.bin"
            files[name] = rng.randbytes(rng.randint(1, 2048))
            (root / name).write_bytes(files[name])
    assert publish(tmp_path / "hub", "many", root, "--block-size", str(BLOCK)) == "v1"
    hub = stack.start_hub(tmp_path / "hub")
    mnt = tmp_path / "mnt"
    extra = ("--mount-workers", "1")
    stack.start_spoke(hub, tmp_path / "cache", mnt, "64MiB", extra=extra, open_files=4096)
    _state(mnt)
    v1 = mnt / "many" / "v1"
    pid = int(CacheLayout(tmp_path / "cache").mount_pid_file.read_text())
    names = sorted(files)

    def one_pass() -> None:
        rng.shuffle(names)
        for name in names:
            assert (v1 / name).read_bytes() == files[name]

    one_pass()  # the first reads fetch the blocks: each open then registers its id
    registered = int(_xattr(mnt, "passthrough_opens")) - int(_xattr(mnt, "backing_reuses"))
    fds = []
    for _ in range(3):
        one_pass()
        fds.append(len(os.listdir(f"/proc/{pid}/fd")))
        opens = int(_xattr(mnt, "passthrough_opens"))
        assert opens - int(_xattr(mnt, "backing_reuses")) == registered  # none registered
    assert int(_xattr(mnt, "idle_backing_ids")) == len(files)
    assert int(_xattr(mnt, "backing_ids")) == len(files)
    assert int(_xattr(mnt, "backing_descriptors")) == 2048
    assert max(fds) - min(fds) <= 4, fds  # nothing accumulates pass after pass (2,400 opens)
    assert fds[0] < 4096
