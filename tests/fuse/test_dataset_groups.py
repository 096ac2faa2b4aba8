"""Per-dataset UNIX groups (``--dataset-groups``) against a real kernel mount: with a rule
for ``team-a*``, a local user in its group reads team-a's bytes, a user outside it gets
EACCES there and on team-b (no rule: deny by default), root reads everything, the names
stay visible, and a bind of a version directory (as the CSI plugin makes for a pod) is
read by anyone; without the option the same user reads every dataset, as before."""

from __future__ import annotations

import grp
import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.local import LocalStack
from tests.support import publish, requires_fuse, traversable_dir

pytestmark = [pytest.mark.fuse, requires_fuse]

READER = 64101
"""The uid (and primary gid) of the local reader: no account needed, setpriv sets it."""

PROBE = """
import errno, hashlib, os, sys
for path in sys.argv[1:]:
    try:
        if os.path.isdir(path):
            print("LIST", ",".join(sorted(os.listdir(path))))
        else:
            with open(path, "rb") as f:
                print("OK", hashlib.sha256(f.read()).hexdigest())
    except OSError as err:
        print(errno.errorcode[err.errno])
"""


def _as_reader(groups: tuple[int, ...], *paths: Path) -> list[str]:
    """What a non-root local user (uid ``READER``, supplementary ``groups``) sees at each
    of ``paths``: ``OK <sha256>``, ``LIST a,b`` or the errno's name."""
    python = shutil.which("python3", path="/usr/bin:/bin") or "python3"
    member = [f"--groups={','.join(map(str, groups))}"] if groups else ["--clear-groups"]
    done = subprocess.run(
        ["setpriv", f"--reuid={READER}", f"--regid={READER}", *member, python, "-c", PROBE,
         *map(str, paths)],
        capture_output=True, text=True, timeout=60, cwd="/",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def _ok(data: bytes) -> str:
    return f"OK {hashlib.sha256(data).hexdigest()}"


@pytest.fixture
def work() -> Iterator[Path]:
    """A directory every user can traverse (pytest's tmp_path is private to root)."""
    with traversable_dir("strata-groups-", "setpriv", "groupadd") as path:
        yield path


@pytest.fixture
def team_a_group() -> Iterator[tuple[str, int]]:
    """A fresh group (name, gid) for team A, deleted afterwards."""
    name = f"strata-ta-{os.getpid()}"
    subprocess.run(["groupadd", name], check=True, capture_output=True, timeout=30)
    try:
        yield name, grp.getgrnam(name).gr_gid
    finally:
        subprocess.run(["groupdel", name], capture_output=True, timeout=30)


DATA = {"team-a-images": b"team a's pixels\n" * 1000, "team-b": b"team b's tokens\n" * 10}


@pytest.mark.parametrize("groups_on", [True, False], ids=["dataset-groups", "without"])
def test_dataset_groups_gate_each_dataset_directory(
    work: Path, team_a_group: tuple[str, int], groups_on: bool
) -> None:
    name, gid_a = team_a_group
    for dataset, data in DATA.items():
        src = work / "src" / dataset
        (src / "sub").mkdir(parents=True)
        (src / "sub" / "data.bin").write_bytes(data)
        assert publish(work / "hub", dataset, src) == "v1"
    mnt = work / "mnt"
    a, b = mnt / "team-a-images", mnt / "team-b"
    file_a, file_b = a / "v1" / "sub" / "data.bin", b / "v1" / "sub" / "data.bin"
    ok_a, ok_b = _ok(DATA["team-a-images"]), _ok(DATA["team-b"])
    extra = ("--allow-other",)
    if groups_on:
        extra += ("--dataset-groups", f"team-a*={name}")
    with LocalStack() as stack:
        hub = stack.start_hub(work / "hub")
        stack.start_spoke(hub, work / "cache", mnt, "64MiB", extra=extra)
        # root reads everything, either way
        assert file_a.read_bytes() == DATA["team-a-images"]
        assert file_b.read_bytes() == DATA["team-b"]
        member = _as_reader((gid_a,), file_a, file_b, a / "v1", mnt)
        outsider = _as_reader((), file_a, file_b, a, mnt)
        assert member[3] == outsider[3] == "LIST team-a-images,team-b"  # names are visible
        if not groups_on:  # as before: the published modes (0644) let every user read
            assert member[:2] == outsider[:2] == [ok_a, ok_b]
            assert outsider[2] == "LIST latest,v1"
            assert (a.stat().st_mode & 0o7777, a.stat().st_uid) == (0o555, 0)
            return
        assert member[:3] == [ok_a, "EACCES", "LIST sub"]  # team-b has no rule: denied
        assert outsider[:3] == ["EACCES", "EACCES", "EACCES"]
        st_a, st_b = a.stat(), b.stat()
        assert (oct(st_a.st_mode), st_a.st_uid, st_a.st_gid) == (oct(0o40550), 0, gid_a)
        assert (oct(st_b.st_mode), st_b.st_uid, st_b.st_gid) == (oct(0o40550), 0, 0)
        # nothing below a dataset directory changes
        assert (a / "v1").stat().st_mode & 0o7777 == 0o555
        assert file_a.stat().st_mode & 0o7777 == 0o644
        # a pod's CSI bind enters at the version: the dataset directory above it is not
        # checked, so the outsider reads through the bind (the kernel walks from its root)
        bind = work / "bind"
        bind.mkdir()
        subprocess.run(["mount", "--bind", str(a / "v1"), str(bind)], check=True, timeout=30)
        try:
            assert _as_reader((), bind / "sub" / "data.bin", bind) == [ok_a, "LIST sub"]
        finally:
            subprocess.run(["umount", "-l", str(bind)], check=False, timeout=30)
