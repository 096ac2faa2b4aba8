"""Mount hand-over (issue 28 deliverable 3): the supervisor holds the FUSE connection, so
a mount process SIGKILLed or upgraded (SIGHUP) is succeeded by one that resumes the same
connection. Readers holding open files — on the pyfuse3 path (O_DIRECT: every read
reaches the mount) and on passthrough — see at most a delay: no ENOTCONN, no EIO, no
wrong byte. With ``--mount-handover off`` the supervisor remounts as before."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench.handover import READERS, Readers
from deploy.local import LocalStack
from spoke.disk.layout import CacheLayout
from spoke.disk.mountinfo import is_mounted, lazy_unmount
from spoke.run.processes import cmdline, read_pid
from tests.support import publish, requires_fuse

pytestmark = [pytest.mark.fuse, requires_fuse]

BLOCK = 65_536
SIZE = "64MiB"


@pytest.fixture
def src(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "chunks").mkdir(parents=True)
    for i in range(READERS):
        (src / f"big{i}.bin").write_bytes(os.urandom(16 * BLOCK + 7))
    for i in range(64):  # one-block files: passthrough where the kernel allows it
        (src / "chunks" / f"c{i:02d}").write_bytes(os.urandom(BLOCK))
    assert publish(tmp_path / "hub", "ds", src, "--block-size", str(BLOCK)) == "v1"
    return src


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[LocalStack]:
    with LocalStack() as s:
        try:
            yield s
        finally:
            layout = CacheLayout(tmp_path / "cache")
            for pid_file in (layout.mount_pid_file, layout.daemon_pid_file):
                pid = read_pid(pid_file)
                args = cmdline(pid) if pid else None
                if pid and args and str(layout.root) in args:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            if is_mounted((tmp_path / "mnt").resolve()):
                lazy_unmount((tmp_path / "mnt").resolve())


def _metric(cache: Path, name: str) -> float:
    admin = (cache / "admin.url").read_text().strip()
    for line in httpx.get(f"{admin}/metrics", timeout=30).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exported")


def _wait(cond: object, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what} did not happen"
        time.sleep(0.05)


def _start(stack: LocalStack, tmp_path: Path, *extra: str) -> tuple[Path, Path, CacheLayout]:
    hub = stack.start_hub(tmp_path / "hub")
    cache, mnt = tmp_path / "cache", tmp_path / "mnt"
    stack.start_spoke(hub, cache, mnt, SIZE, extra=extra)
    return cache, mnt, CacheLayout(cache)


@pytest.mark.parametrize("how", ["sigkill", "sighup"])
def test_a_mount_killed_or_upgraded_under_readers_resumes_its_connection(
    tmp_path: Path, src: Path, stack: LocalStack, how: str
) -> None:
    cache, mnt, layout = _start(stack, tmp_path)
    assert stack.spoke is not None
    mount = read_pid(layout.mount_pid_file)
    readers = Readers(mnt / "ds" / "v1", src, BLOCK)
    try:
        _wait(lambda: readers.reads > 200, "reads before")
        for round_ in range(2):
            before = readers.reads
            if how == "sigkill":
                assert mount is not None
                os.kill(mount, signal.SIGKILL)
            else:
                os.kill(stack.spoke.pid, signal.SIGHUP)
            _wait(lambda m=mount: read_pid(layout.mount_pid_file) not in (None, m), "a successor")  # type: ignore[misc]
            mount = read_pid(layout.mount_pid_file)
            _wait(lambda b=before: readers.reads > b + 200, "reads after")
            _wait(
                lambda r=round_: _metric(cache, "strata_spoke_mount_handovers_total") == r + 1,
                "the hand-over counted",
            )
    finally:
        readers.finish()
    assert readers.errors == []
    assert _metric(cache, "strata_spoke_mount_restarts_total") == 0  # never remounted
    assert stack.spoke.poll() is None
    print(f"{how}: {readers.reads} reads, longest {readers.longest:.3f} s")
    assert readers.longest < 10  # the target (2 s) is measured by bench.mount_io, not here
    # a file opened before both hand-overs, a listing and a new open after them
    names = sorted(os.listdir(mnt / "ds" / "v1" / "chunks"))
    assert len(names) == 64
    assert (mnt / "ds" / "v1" / "big0.bin").read_bytes() == (src / "big0.bin").read_bytes()
    stack.stop_spoke()
    assert not is_mounted(mnt.resolve())


def test_with_hand_over_off_a_killed_mount_is_remounted_as_before(
    tmp_path: Path, src: Path, stack: LocalStack
) -> None:
    cache, mnt, layout = _start(stack, tmp_path, "--mount-handover", "off")
    mount = read_pid(layout.mount_pid_file)
    fd = os.open(mnt / "ds" / "v1" / "big0.bin", os.O_RDONLY | os.O_DIRECT)
    try:
        assert os.pread(fd, BLOCK, 0) == (src / "big0.bin").read_bytes()[:BLOCK]
        assert mount is not None
        os.kill(mount, signal.SIGKILL)
        _wait(lambda: read_pid(layout.mount_pid_file) not in (None, mount), "a remount")
        _wait(lambda: _metric(cache, "strata_spoke_mount_restarts_total") == 1, "the remount")
        with pytest.raises(OSError):  # the old connection is gone with its process
            os.pread(fd, BLOCK, BLOCK)
    finally:
        with contextlib.suppress(OSError):  # its flush fails too (ENOTCONN)
            os.close(fd)
    assert _metric(cache, "strata_spoke_mount_handovers_total") == 0
    assert (mnt / "ds" / "v1" / "big1.bin").read_bytes() == (src / "big1.bin").read_bytes()
