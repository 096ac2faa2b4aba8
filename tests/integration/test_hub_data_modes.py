"""The hub's data directory is owner-only whatever the umask it was started with: a
publish and a serve under umask 022 leave every directory 0700 and every file 0600 (the
catalog's ``data.mdb`` names every dataset and digest), and a data directory left looser
(an older hub, a volume's ``fsGroup``) is tightened when the hub starts."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from tests.integration.test_hub_cli import COMMAND, REPO_ROOT, SERVING, read_line


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
