"""Faults nobody had listed (issue 17's own campaign): a low open-file limit, a torn block
file after power loss, a hub restarted with another catalog under the same address."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.local import LocalStack, stop_process
from spoke.disk.mountinfo import is_mounted
from tests.support import publish, requires_fuse

pytestmark = [pytest.mark.fuse, requires_fuse]


@pytest.fixture
def stack() -> Iterator[LocalStack]:
    with LocalStack() as s:
        yield s


def _low_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 8192))  # systemd's soft default


def test_more_cached_blocks_than_the_soft_open_file_limit(
    tmp_path: Path, stack: LocalStack
) -> None:
    """Under a soft limit of 1024 open files (systemd's default), reading 1500 cached
    one-block files keeps working: the mount raises its soft limit to the hard one."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(1500):
        (src / f"f{i:04d}.bin").write_bytes(i.to_bytes(4, "big") * 16)
    publish(tmp_path / "hub", "ds", src)
    hub = stack.start_hub(tmp_path / "hub")
    mnt = (tmp_path / "mnt").resolve()
    mnt.mkdir()
    spoke = subprocess.Popen(
        [sys.executable, "-m", "spoke", "run", "--hub", hub, "--cache-dir",
         str(tmp_path / "cache"), "--cache-size", "64MiB", "--mount", str(mnt),
         "--admin", "127.0.0.1:0", "--log-level", "WARNING"],
        start_new_session=True,
        preexec_fn=_low_fd_limit,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (is_mounted(mnt) and (tmp_path / "cache" / "admin.url").exists()):
            assert spoke.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        for _ in range(2):  # misses, then hits of files the mount keeps open
            for i in range(1500):
                path = mnt / "ds" / "v1" / f"f{i:04d}.bin"
                fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
                try:
                    assert os.pread(fd, 4096, 0) == i.to_bytes(4, "big") * 16, path
                finally:
                    os.close(fd)
    finally:
        stop_process(spoke)
