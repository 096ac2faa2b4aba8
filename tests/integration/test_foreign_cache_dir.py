"""A cache directory another local user made (in a sticky, world-writable directory such
as /dev/shm), with their admin token and world-writable LMDB files in it, is refused by
the daemon, by ``strata-spoke run`` and by the mount, in one line, before anything is
read or written there: the attacker's token is never used (no admin API ever listens),
nothing lands in their files, and no socket is bound where they could move it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spoke.disk.layout import CacheLayout
from spoke.disk.mountinfo import is_mounted, lazy_unmount
from tests.support import file_states, other_user, planted_dir, requires_fuse, sticky_dir

ATTACKER_TOKEN = b"the-attackers-token\n"
PLANTED = {"admin.token": ATTACKER_TOKEN, "index/data.mdb": b"", "index/lock.mdb": b""}
START_TIMEOUT = 60.0


@pytest.fixture
def shared() -> Iterator[Path]:
    with sticky_dir() as path:
        yield path


@pytest.fixture
def evil(shared: Path) -> Path:
    """The probe's ``/dev/shm/evil``: the other user's, 0777, their token and 0666 LMDB files."""
    return planted_dir(shared, "evil", PLANTED)


def _refusal(shared: Path, evil: Path) -> str:
    uid = other_user().pw_uid
    return (
        f"cache dir {evil}: {evil} belongs to uid {uid}, who could replace it "
        f"({shared} is sticky but writable by others)"
    )


def _run_until_exit(cmd: list[str], started: Path, cleanup: Path | None = None) -> tuple[int, str]:
    """Run ``cmd`` until it exits; fail (and stop it) if ``started`` appears first, i.e. it
    started serving on the directory it should have refused."""
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + START_TIMEOUT
    try:
        while proc.poll() is None:
            if started.exists() or (cleanup is not None and is_mounted(cleanup)):
                raise AssertionError(f"{cmd[2:4]} started on another user's directory")
            assert time.monotonic() < deadline, "neither refused nor started"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(30)
        if cleanup is not None and is_mounted(cleanup):
            lazy_unmount(cleanup)
    assert proc.stderr is not None
    return proc.returncode, proc.stderr.read()


def _daemon_cmd(cache: Path) -> list[str]:
    cmd = [sys.executable, "-m", "spoke", "daemon", "--hub", "127.0.0.1:1"]
    return [*cmd, "--cache-dir", str(cache), "--cache-size", "64MiB", "--admin", "127.0.0.1:0"]


def test_the_daemon_refuses_another_users_cache_dir_and_writes_nothing(
    shared: Path, evil: Path
) -> None:
    before = file_states(evil)
    code, err = _run_until_exit(_daemon_cmd(evil), CacheLayout(evil).admin_url_file)
    assert code == 2, err
    assert err.strip().splitlines()[-1] == f"strata-spoke: error: daemon: {_refusal(shared, evil)}"
    assert file_states(evil) == before  # no lock, socket, pid, audit line or index page


def test_the_daemon_refuses_planted_files_in_a_cache_dir_of_its_own(shared: Path) -> None:
    """A cache dir of root's that was left world-writable: another user put their token
    and 0666 LMDB files in it. Refused (naming what is theirs), nothing of theirs used."""
    cache = shared / "mine"
    cache.mkdir()
    os.chmod(cache, 0o777)
    planted_dir(cache, "index", {"data.mdb": b"", "lock.mdb": b""})
    before = file_states(cache / "index")
    code, err = _run_until_exit(_daemon_cmd(cache), CacheLayout(cache).admin_url_file)
    assert code == 2, err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"strata-spoke: error: daemon: cache dir {cache}: {cache}/index"), line
    assert f"belongs to uid {other_user().pw_uid}, not to this user (0)" in line
    assert file_states(cache / "index") == before


@requires_fuse
@pytest.mark.fuse
def test_strata_spoke_run_refuses_it_before_starting_anything(
    shared: Path, evil: Path, tmp_path: Path
) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    before = file_states(evil)
    cmd = [sys.executable, "-m", "spoke", "run", "--hub", "127.0.0.1:1", "--mount", str(mnt)]
    cmd += ["--cache-dir", str(evil), "--cache-size", "64MiB", "--admin", "127.0.0.1:0"]
    code, err = _run_until_exit(cmd, CacheLayout(evil).admin_url_file, cleanup=mnt)
    assert code == 1, err
    assert err.strip().splitlines() == [f"strata-spoke: error: {_refusal(shared, evil)}"]
    assert file_states(evil) == before  # not even spoke.lock


@requires_fuse
@pytest.mark.fuse
def test_a_mount_refuses_it_before_mounting(shared: Path, evil: Path, tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    before = file_states(evil)
    cmd = [sys.executable, "-m", "fusemount", "--cache-dir", str(evil), str(mnt)]
    code, err = _run_until_exit(cmd, CacheLayout(evil).mount_pid_file, cleanup=mnt)
    assert code == 2, err
    assert err.strip().splitlines() == [f"strata-mount: error: {_refusal(shared, evil)}"]
    assert file_states(evil) == before
    assert not is_mounted(mnt)
