"""The hub's data directory is owner-only whatever the umask it was started with: a
publish and a serve under umask 022 leave every directory 0700 and every file 0600 (the
catalog's ``data.mdb`` names every dataset and digest), and a data directory left looser
(an older hub, a volume's ``fsGroup``) is tightened when the hub starts; one another local
user could change (theirs, or holding their files) is refused before anything is read or
written there."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_hub_cli import (
    COMMAND,
    REPO_ROOT,
    SERVING,
    assert_one_line_error,
    read_line,
)
from tests.support import file_states, other_user, planted_dir, sticky_dir


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COMMAND, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, umask=0o022
    )


def _modes(root: Path) -> dict[str, int]:
    """Every path under ``root`` (itself as ``.``) and its permission bits."""
    found = {".": stat.S_IMODE(os.lstat(root).st_mode)}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(dirpath) / name
            found[str(path.relative_to(root))] = stat.S_IMODE(os.lstat(path).st_mode)
    return found


def _assert_owner_only(root: Path) -> dict[str, int]:
    modes = _modes(root)
    for rel, mode in modes.items():
        expected = 0o700 if (root / rel).is_dir() else 0o600
        assert mode == expected, f"{rel} is {mode:04o}, not {expected:04o}"
    return modes


def _serve_once(data: Path, tmp_path: Path) -> None:
    """Start ``strata-hub serve`` under umask 022, wait until it serves, stop it."""
    process = subprocess.Popen(
        [*COMMAND, "serve", "--data-dir", str(data), "--listen", "127.0.0.1:0"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        umask=0o022,
    )
    try:
        assert SERVING.fullmatch(read_line(process, 30)), process
    finally:
        process.terminate()
        _, err = process.communicate(timeout=30)
    assert process.returncode == 0, err


def test_publish_and_serve_under_umask_022_leave_everything_owner_only(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)  # a parent others may enter: only the data dir's modes count
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.bin").write_bytes(os.urandom(3000))
    (src / "sub" / "b.txt").write_bytes(b"b")
    data = tmp_path / "data"
    done = _run("publish", "--data-dir", str(data), "f3", str(src))
    assert done.returncode == 0, done.stderr
    _serve_once(data, tmp_path)
    modes = _assert_owner_only(data)
    for expected in ("catalog", "catalog/data.mdb", "catalog/lock.mdb", "blobs", "audit.jsonl"):
        assert expected in modes, sorted(modes)
    blobs = [rel for rel in modes if rel.startswith("blobs/") and rel.count("/") == 2]
    assert len(blobs) == 2, sorted(modes)  # a.bin and b.txt, in their fan-out directories


def test_a_data_dir_left_looser_is_tightened_at_start(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(b"a" * 300)
    data = tmp_path / "data"
    assert _run("publish", "--data-dir", str(data), "f3", str(src)).returncode == 0
    # what an older hub under umask 022 left: directories 0755, catalog and audit 0644
    # (blob files were always 0600, from mkstemp; start-up does not walk every blob, they
    # are behind their 0700 fan-out directories)
    for dirpath, _dirs, files in os.walk(data):
        os.chmod(dirpath, 0o755)
        for name in files:
            if not dirpath.startswith(str(data / "blobs")):
                os.chmod(Path(dirpath) / name, 0o644)
    assert _modes(data)["catalog/data.mdb"] == 0o644
    _serve_once(data, tmp_path)
    _assert_owner_only(data)


def test_a_directory_that_is_no_data_dir_is_left_alone(tmp_path: Path) -> None:
    """A wrong ``--data-dir`` (say a home directory) must not have its modes changed."""
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    (home / "notes.txt").write_text("mine")
    os.chmod(home / "notes.txt", 0o644)
    done = _run("ls", "--data-dir", str(home))
    assert done.returncode != 0
    assert stat.S_IMODE(home.stat().st_mode) == 0o755
    assert stat.S_IMODE((home / "notes.txt").stat().st_mode) == 0o644


@pytest.fixture
def shared() -> Iterator[Path]:
    with sticky_dir() as path:
        yield path


PLANTED = {"catalog/data.mdb": b"", "catalog/lock.mdb": b"", "grant.key": b"their key"}
"""What another user leaves in a data directory: world-writable catalog files and a grant
signing key they know (grants signed with it would be theirs to forge)."""


@pytest.mark.parametrize("command", ["serve", "publish"])
def test_another_users_data_dir_is_refused_and_nothing_is_written_there(
    shared: Path, tmp_path: Path, command: str
) -> None:
    evil = planted_dir(shared, "evil", PLANTED)
    before = file_states(evil)
    if command == "serve":
        process = subprocess.Popen(
            [*COMMAND, "serve", "--data-dir", str(evil), "--listen", "127.0.0.1:0"],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = read_line(process, 30)
        if SERVING.fullmatch(line):
            process.terminate()
            process.wait(30)
            raise AssertionError("the hub serves another user's data dir")
        _, err = process.communicate(timeout=30)
        done = subprocess.CompletedProcess(process.args, process.returncode, line, err)
    else:
        src = tmp_path / "src"
        src.mkdir()
        (src / "a.bin").write_bytes(b"a")
        done = _run("publish", "--data-dir", str(evil), "f3", str(src))
    uid = other_user().pw_uid
    assert_one_line_error(
        done,
        f"strata-hub: error: data dir {evil}: {evil} belongs to uid {uid}, who could "
        f"replace it ({shared} is sticky but writable by others)\n",
    )
    assert file_states(evil) == before  # no catalog page, no audit line, no key read


def test_a_planted_grant_key_in_a_data_dir_of_ours_is_refused(shared: Path, tmp_path: Path) -> None:
    data = shared / "data"
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(b"a")
    assert _run("publish", "--data-dir", str(data), "f3", str(src)).returncode == 0
    os.chmod(data, 0o777)  # left world-writable: another user got a file in
    planted_dir(data, "grant.key", {})  # an empty directory is enough to take the name
    done = _run("ls", "--data-dir", str(data))
    assert_one_line_error(
        done, f"data dir {data}: {data / 'grant.key'} belongs to uid {other_user().pw_uid}"
    )
