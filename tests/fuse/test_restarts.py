"""The supervisor under restarts (issue 17 items 5-7): a mount killed while being remounted,
a supervisor killed outright and a new one adopting what it left, an in-place upgrade
(SIGHUP) and a hand-over (SIGUSR1) that readers holding open files never notice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from deploy.local import LocalStack, admin_headers
from spoke.disk.layout import CacheLayout
from spoke.disk.mountinfo import is_mounted
from spoke.run.processes import cmdline, read_pid
from tests.support import (
    eventually,
    new_pid,
    publish,
    requires_fuse,
    spoke_metric,
    supervised_stack,
)

pytestmark = [pytest.mark.fuse, requires_fuse]

BLOCK = 65_536
SIZE = "64MiB"


@pytest.fixture
def src(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "big.bin").write_bytes(os.urandom(12 * BLOCK + 5))
    (src / "small.txt").write_text("hello strata\n")
    assert publish(tmp_path / "hub", "ds", src, "--block-size", str(BLOCK)) == "v1"
    return src


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[LocalStack]:
    with supervised_stack(tmp_path) as s:
        yield s


def _run_args(hub: str, tmp_path: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "spoke", "run", "--hub", hub,
        "--cache-dir", str(tmp_path / "cache"), "--cache-size", SIZE,
        "--mount", str((tmp_path / "mnt").resolve()), "--admin", "127.0.0.1:0",
        "--log-level", "WARNING",
        # as LocalStack starts its spokes: the same settings, so a new run can adopt them
        *extra,
    ]  # fmt: skip


def _children(parent: int, program: str) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        args = cmdline(int(entry.name)) or []
        if ppid == parent and program in args:
            out.append(int(entry.name))
    return out


class Reader:
    """A reader holding one open file of the mount, reading it in pieces (O_DIRECT: every
    read reaches the mount, none is served from the page cache)."""

    def __init__(self, path: Path, expected: bytes) -> None:
        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        self.expected = expected

    def check(self, block: int) -> None:
        assert os.pread(self.fd, BLOCK, block * BLOCK) == self.expected[block * BLOCK :][:BLOCK]

    def close(self) -> None:
        os.close(self.fd)


def test_a_mount_killed_while_being_remounted_never_stops_the_spoke(
    tmp_path: Path, src: Path, stack: LocalStack
) -> None:
    """Item 5: kill the mount, then kill each replacement before it mounts: the supervisor
    keeps retrying with backoff and mounts again; the daemon is never taken down."""
    hub = stack.start_hub(tmp_path / "hub")
    cache, mnt = tmp_path / "cache", tmp_path / "mnt"
    stack.start_spoke(hub, cache, mnt, SIZE)
    assert stack.spoke is not None
    supervisor = stack.spoke.pid
    layout = CacheLayout(cache)
    daemon, mount = read_pid(layout.daemon_pid_file), read_pid(layout.mount_pid_file)
    assert daemon and mount
    os.kill(mount, signal.SIGKILL)
    killed = {mount}
    deadline = time.monotonic() + 30
    while len(killed) < 4 and time.monotonic() < deadline:
        for pid in _children(supervisor, "fusemount"):
            if pid not in killed:
                os.kill(pid, signal.SIGKILL)  # the replacement, as it starts
                killed.add(pid)
        time.sleep(0.01)
    assert len(killed) == 4
    eventually(lambda: read_pid(layout.mount_pid_file) not in killed, "a remount")
    eventually(lambda: is_mounted(mnt.resolve()), "a remount")
    assert stack.spoke.poll() is None, "the supervisor exited"
    assert read_pid(layout.daemon_pid_file) == daemon  # the daemon was never touched
    assert (mnt / "ds" / "v1" / "big.bin").read_bytes() == (src / "big.bin").read_bytes()
    assert spoke_metric(cache, "strata_spoke_mount_restarts_total") >= 1


def test_a_new_supervisor_adopts_what_a_killed_one_left(
    tmp_path: Path, src: Path, stack: LocalStack
) -> None:
    """Item 6: SIGKILL the supervisor: daemon and mount go on serving; a new
    ``strata-spoke run`` with the same arguments adopts both (and says so), supervises
    them (a killed mount is remounted, counted) and stops them at SIGTERM."""
    hub = stack.start_hub(tmp_path / "hub")
    cache, mnt = tmp_path / "cache", tmp_path / "mnt"
    stack.start_spoke(hub, cache, mnt, SIZE)
    assert stack.spoke is not None
    layout = CacheLayout(cache)
    daemon, mount = read_pid(layout.daemon_pid_file), read_pid(layout.mount_pid_file)
    reader = Reader(mnt / "ds" / "v1" / "big.bin", (src / "big.bin").read_bytes())
    try:
        reader.check(0)
        os.kill(stack.spoke.pid, signal.SIGKILL)
        stack.spoke.wait()
        reader.check(1)  # unsupervised, still serving (a miss: the daemon is up)
        second = subprocess.Popen(
            _run_args(hub, tmp_path), stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        try:
            assert second.stdout is not None
            said = second.stdout.readline().strip()
            assert said == (
                f"strata-spoke: adopted daemon pid {daemon} and mount pid {mount} of {layout.root}"
            )
            assert second.stdout.readline().startswith("strata-spoke: mounted ")
            assert read_pid(layout.daemon_pid_file) == daemon
            assert read_pid(layout.mount_pid_file) == mount
            for block in range(2, 12):
                reader.check(block)  # the same open file, hits and misses
            assert spoke_metric(cache, "strata_spoke_mount_restarts_total") == 0
            assert mount is not None
            os.kill(mount, signal.SIGKILL)  # supervised again: remounted and counted
            eventually(lambda: read_pid(layout.mount_pid_file) not in (None, mount), "a remount")
            eventually(lambda: is_mounted(mnt.resolve()), "a remount")
            assert (mnt / "ds" / "v1" / "small.txt").read_text() == "hello strata\n"
            # counted once the remount's start returned: just after the mount is visible
            eventually(
                lambda: spoke_metric(cache, "strata_spoke_mount_restarts_total") == 1,
                "the remount counted",
            )
            second.send_signal(signal.SIGTERM)
            assert second.wait(60) == 0
        finally:
            if second.poll() is None:
                second.kill()
        assert not is_mounted(mnt.resolve())
        assert not layout.daemon_pid_file.exists() and not layout.mount_pid_file.exists()
    finally:
        reader.close()


def test_a_new_supervisor_with_other_settings_restarts_the_daemon_only(
    tmp_path: Path, src: Path, stack: LocalStack
) -> None:
    """Item 6: the orphaned daemon ran with another --cache-size: it is stopped cleanly and
    started anew; the mount (same settings) is adopted and its open files keep working."""
    hub = stack.start_hub(tmp_path / "hub")
    cache, mnt = tmp_path / "cache", tmp_path / "mnt"
    stack.start_spoke(hub, cache, mnt, "32MiB")
    assert stack.spoke is not None
    layout = CacheLayout(cache)
    daemon, mount = read_pid(layout.daemon_pid_file), read_pid(layout.mount_pid_file)
    reader = Reader(mnt / "ds" / "v1" / "big.bin", (src / "big.bin").read_bytes())
    try:
        reader.check(0)
        os.kill(stack.spoke.pid, signal.SIGKILL)
        stack.spoke.wait()
        second = subprocess.Popen(
            _run_args(hub, tmp_path), stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        try:
            assert second.stdout is not None
            assert second.stdout.readline().strip() == (
                f"strata-spoke: stopped daemon pid {daemon} (other settings) and adopted "
                f"mount pid {mount} of {layout.root}"
            )
            assert second.stdout.readline().startswith("strata-spoke: mounted ")
            assert read_pid(layout.daemon_pid_file) not in (None, daemon)
            for block in range(1, 12):
                reader.check(block)
            stats = httpx.get(
                f"{layout.admin_url_file.read_text().strip()}/v1/cache",
                headers=admin_headers(layout.root),
            ).json()
            assert stats["capacity_bytes"] == 64 << 20
            second.send_signal(signal.SIGTERM)
            assert second.wait(60) == 0
        finally:
            if second.poll() is None:
                second.kill()
    finally:
        reader.close()


@pytest.mark.parametrize("handover", ["auto", "off"])
def test_an_in_place_upgrade_keeps_open_files_working(
    tmp_path: Path, src: Path, stack: LocalStack, handover: str
) -> None:
    """Item 7: SIGHUP re-executes the supervisor and restarts the daemon (new code for
    both); the mount's connection stays — handed to a new mount process (new code too),
    or, with ``--mount-handover off``, served by the same process — so a reader holding an
    open file never notices."""
    hub = stack.start_hub(tmp_path / "hub")
    cache, mnt = tmp_path / "cache", tmp_path / "mnt"
    stack.start_spoke(hub, cache, mnt, SIZE, extra=("--mount-handover", handover))
    assert stack.spoke is not None
    layout = CacheLayout(cache)
    daemon, mount = read_pid(layout.daemon_pid_file), read_pid(layout.mount_pid_file)
    reader = Reader(mnt / "ds" / "v1" / "big.bin", (src / "big.bin").read_bytes())
    try:
        reader.check(0)
        for round_ in range(2):
            os.kill(stack.spoke.pid, signal.SIGHUP)
            old = daemon
            daemon = new_pid(layout.daemon_pid_file, old, "a restart")
            # the new daemon writes its pid first and its admin address once it serves
            eventually(layout.admin_url_file.exists, "the new daemon's admin address")
            for block in range(1 + 5 * round_, 6 + 5 * round_):
                reader.check(block)  # misses served by the new daemon
            assert stack.spoke.poll() is None  # the same supervisor process, new code
            if handover == "off":
                assert read_pid(layout.mount_pid_file) == mount
            else:
                mount = new_pid(layout.mount_pid_file, mount, "a successor")
        assert (mnt / "ds" / "v1" / "small.txt").read_text() == "hello strata\n"
        assert spoke_metric(cache, "strata_spoke_mount_restarts_total") == 0
        handovers = 2 if handover == "auto" else 0
        assert spoke_metric(cache, "strata_spoke_mount_handovers_total") == handovers
        stack.stop_spoke()
        assert not is_mounted(mnt.resolve()) and not layout.daemon_pid_file.exists()
    finally:
        reader.close()


def test_a_hand_over_to_a_new_supervisor_keeps_open_files_working(
    tmp_path: Path, src: Path, stack: LocalStack
) -> None:
    """Item 7: SIGUSR1 makes the supervisor exit and leave daemon and mount serving; the next
    ``strata-spoke run`` adopts them, and the open file reads on throughout."""
    hub = stack.start_hub(tmp_path / "hub")
    cache, mnt = tmp_path / "cache", tmp_path / "mnt"
    stack.start_spoke(hub, cache, mnt, SIZE)
    assert stack.spoke is not None
    layout = CacheLayout(cache)
    mount = read_pid(layout.mount_pid_file)
    reader = Reader(mnt / "ds" / "v1" / "big.bin", (src / "big.bin").read_bytes())
    try:
        reader.check(0)
        os.kill(stack.spoke.pid, signal.SIGUSR1)
        assert stack.spoke.wait(60) == 0
        reader.check(1)
        second = subprocess.Popen(
            _run_args(hub, tmp_path), stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        try:
            assert second.stdout is not None
            assert second.stdout.readline().startswith("strata-spoke: adopted daemon pid ")
            for block in range(2, 12):
                reader.check(block)
            assert read_pid(layout.mount_pid_file) == mount
            second.send_signal(signal.SIGTERM)
            assert second.wait(60) == 0
        finally:
            if second.poll() is None:
                second.kill()
    finally:
        reader.close()


def test_a_mountpoint_busy_with_another_spokes_mount_is_refused_naming_it(
    tmp_path: Path, src: Path, stack: LocalStack
) -> None:
    hub = stack.start_hub(tmp_path / "hub")
    stack.start_spoke(hub, tmp_path / "cache", tmp_path / "mnt", SIZE)
    mount = read_pid(CacheLayout(tmp_path / "cache").mount_pid_file)
    other = subprocess.run(
        [*_run_args(hub, tmp_path)[:7], str(tmp_path / "cache2"), *_run_args(hub, tmp_path)[8:]],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert other.returncode == 1
    assert other.stderr.strip().splitlines() == [
        f"strata-spoke: error: mountpoint {(tmp_path / 'mnt').resolve()} is busy: something "
        f"other than this cache dir's mount is mounted there (strata mount pid {mount})"
    ]
    assert (tmp_path / "mnt" / "ds" / "v1" / "small.txt").read_text() == "hello strata\n"
