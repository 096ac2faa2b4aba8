"""The mount never dies under a running job: handler faults, a killed daemon, a killed
mount process, a stale mount left behind."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.local import LocalStack
from fusemount.boundary import FAULT_FILE_ENV
from spoke.disk.layout import CacheLayout
from spoke.disk.mountinfo import is_mounted
from tests.support import (
    eventually_ok,
    make_tree,
    new_pid,
    publish,
    requires_fuse,
    tree_digests,
)

pytestmark = [pytest.mark.fuse, requires_fuse]


@pytest.fixture
def src(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    make_tree(src)
    assert publish(tmp_path / "hub", "ds", src, "--block-size", "65536") == "v1"
    return src


@pytest.fixture
def stack() -> Iterator[LocalStack]:
    with LocalStack() as s:
        yield s


def test_every_handler_fault_becomes_eio_and_the_mount_keeps_serving(
    tmp_path: Path,
    src: Path,
    stack: LocalStack,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    faults = tmp_path / "faults"
    monkeypatch.setenv(FAULT_FILE_ENV, str(faults))
    hub = stack.start_hub(tmp_path / "hub")
    stack.start_spoke(hub, tmp_path / "cache", tmp_path / "mnt", "64MiB")
    v1 = tmp_path / "mnt" / "ds" / "v1"
    probes = {  # handler -> an operation that reaches it (on a fresh name: no kernel cache)
        "lookup": lambda i: os.stat(v1 / "nested" / f"missing-{i}"),
        "getattr": lambda i: os.stat(tmp_path / "mnt"),
        "opendir": lambda i: os.listdir(v1 / "nested"),
        "open": lambda i: open(v1 / "small.txt", "rb").close(),
        "read": lambda i: os.pread(
            os.open(v1 / "big.bin", os.O_RDONLY | os.O_DIRECT), 4096, 4096 * i
        ),
        "readlink": lambda i: os.readlink(v1 / "link-to-small"),
        "statfs": lambda i: os.statvfs(v1),
        "getxattr": lambda i: os.getxattr(v1, "user.strata.version"),
        "listxattr": lambda i: os.listxattr(v1),
    }
    for i, (handler, probe) in enumerate(probes.items()):
        faults.write_text(handler)
        if handler in ("getattr", "readlink"):
            # product interval: the mount's 1 s attribute/entry timeouts lapse, so the
            # kernel asks the mount again instead of answering from its cache
            time.sleep(1.1)
        with pytest.raises(OSError) as info:
            probe(i)
        assert info.value.errno == errno.EIO, handler
        faults.write_text("")
        assert tree_digests(v1) == tree_digests(src), f"mount broken after {handler}"
    assert is_mounted((tmp_path / "mnt").resolve())
    counted = int(os.getxattr(tmp_path / "mnt", "user.strata.handler_errors"))
    assert counted == len(probes)
    logged = capfd.readouterr().err  # the mount process writes to the inherited stderr
    for handler in probes:
        assert f"unexpected error in {handler}; returning EIO" in logged


def test_killed_mount_process_is_remounted(tmp_path: Path, src: Path, stack: LocalStack) -> None:
    hub = stack.start_hub(tmp_path / "hub")
    cache, mnt = tmp_path / "cache", tmp_path / "mnt"
    stack.start_spoke(hub, cache, mnt, "64MiB")
    v1 = mnt / "ds" / "v1"
    assert tree_digests(v1) == tree_digests(src)
    pid_file = CacheLayout(cache).mount_pid_file
    old = int(pid_file.read_text())
    os.kill(old, signal.SIGKILL)
    new_pid(pid_file, old, "the mount restarted")
    want = tree_digests(src)

    def same() -> None:
        got = tree_digests(v1)
        assert got == want, got

    # a reader that retries succeeds once the supervisor has remounted. OSError: the
    # killed mount's dead connection; AssertionError: the bare, empty mountpoint between
    # the supervisor's lazy unmount and the new mount (whose pid file is written before it
    # mounts)
    eventually_ok(
        same,
        "the remounted tree whole",
        retry=lambda err: isinstance(err, (OSError, AssertionError)),
    )
    assert is_mounted(mnt.resolve())


def test_daemon_killed_while_streaming(tmp_path: Path, src: Path, stack: LocalStack) -> None:
    hub = stack.start_hub(tmp_path / "hub")
    cache, mnt = tmp_path / "cache", tmp_path / "mnt"
    stack.start_spoke(hub, cache, mnt, "64MiB")
    big = mnt / "ds" / "v1" / "big.bin"
    expected = (src / "big.bin").read_bytes()
    fd = os.open(big, os.O_RDONLY | os.O_DIRECT)
    try:
        first = os.pread(fd, 65536, 0)  # block 0 cached, the rest not yet
        pid_file = CacheLayout(cache).daemon_pid_file
        old = int(pid_file.read_text())
        os.kill(old, signal.SIGKILL)
        assert os.pread(fd, 65536, 0) == first == expected[:65536]  # hits go on meanwhile
        rest = os.pread(fd, len(expected), 65536)  # misses wait for the restarted daemon
        assert first + rest == expected
        assert new_pid(pid_file, old, "the mount restarted") != old
    finally:
        os.close(fd)


def test_stale_mount_is_cleaned_up_at_start(tmp_path: Path, src: Path, stack: LocalStack) -> None:
    hub = stack.start_hub(tmp_path / "hub")
    cache, mnt = tmp_path / "cache", (tmp_path / "mnt").resolve()
    mnt.mkdir()
    cache.mkdir()
    orphan = subprocess.Popen(
        [sys.executable, "-m", "fusemount", "--cache-dir", str(cache), str(mnt)],
        start_new_session=True,
    )
    deadline = time.monotonic() + 20
    while not is_mounted(mnt):
        assert time.monotonic() < deadline and orphan.poll() is None
        time.sleep(0.05)
    orphan.kill()  # a dead FUSE server leaves its mount: ENOTCONN
    orphan.wait()
    with pytest.raises(OSError) as info:
        os.listdir(mnt)
    assert info.value.errno == errno.ENOTCONN
    stack.start_spoke(hub, cache, mnt, "64MiB")
    assert tree_digests(mnt / "ds" / "v1") == tree_digests(src)


def test_a_second_spoke_on_the_same_cache_dir_is_refused(
    tmp_path: Path, src: Path, stack: LocalStack
) -> None:
    hub = stack.start_hub(tmp_path / "hub")
    cache, mnt = tmp_path / "cache", tmp_path / "mnt"
    stack.start_spoke(hub, cache, mnt, "64MiB")
    layout = CacheLayout(cache)
    assert tree_digests(mnt / "ds" / "v1") == tree_digests(src)
    (tmp_path / "mnt2").mkdir()
    base = [sys.executable, "-m", "spoke"]
    run = [*base, "run", "--hub", hub, "--cache-dir", str(cache), "--cache-size", "64MiB"]
    second = subprocess.run(
        [*run, "--mount", str(tmp_path / "mnt2"), "--admin", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode == 1
    assert second.stderr.strip().splitlines() == [
        f"strata-spoke: error: cache dir {cache} is in use by another strata-spoke run "
        f"(pid {stack.spoke.pid if stack.spoke else '?'}) (--take-over succeeds it)"
    ]
    daemon = subprocess.run(
        [*base, "daemon", "--hub", hub, "--cache-dir", str(cache), "--cache-size", "64MiB",
         "--admin", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert daemon.returncode == 2 and "in use by another spoke daemon (pid" in daemon.stderr
    assert not is_mounted(tmp_path / "mnt2")
    assert layout.socket_path.exists()  # the running spoke's socket was left alone
    assert tree_digests(mnt / "ds" / "v1") == tree_digests(src)  # and it still serves
    stack.stop_spoke()
    assert not layout.daemon_pid_file.exists() and not layout.mount_pid_file.exists()
