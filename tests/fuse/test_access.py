"""Access control: only the mounting user by default; with --allow-other, the kernel
checks the manifest's file modes (default_permissions)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.local import LocalStack
from tests.support import publish, requires_fuse, traversable_dir

pytestmark = [pytest.mark.fuse, requires_fuse]


def _as_nobody(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["runuser", "-u", "nobody", "--", *cmd], capture_output=True, text=True)


@pytest.fixture
def work() -> Iterator[Path]:
    """A directory every user can traverse (pytest's tmp_path is private to root)."""
    with traversable_dir("strata-access-", "runuser") as path:
        yield path


@pytest.fixture
def src(work: Path) -> Path:
    tmp_path = work
    src = tmp_path / "src"
    src.mkdir()
    (src / "public.txt").write_text("for everyone\n")
    (src / "private.txt").write_text("owner only\n")
    (src / "private.txt").chmod(0o600)
    assert publish(tmp_path / "hub", "ds", src) == "v1"
    return src


@pytest.mark.parametrize("allow_other", [False, True])
def test_other_users(work: Path, src: Path, allow_other: bool) -> None:
    tmp_path = work
    with LocalStack() as stack:
        hub = stack.start_hub(tmp_path / "hub")
        extra = ("--allow-other",) if allow_other else ()
        stack.start_spoke(hub, tmp_path / "cache", tmp_path / "mnt", "64MiB", extra=extra)
        v1 = tmp_path / "mnt" / "ds" / "v1"
        assert (v1 / "private.txt").read_text() == "owner only\n"  # the mounting user: root
        public = _as_nobody("cat", str(v1 / "public.txt"))
        private = _as_nobody("cat", str(v1 / "private.txt"))
        if allow_other:
            assert public.returncode == 0 and public.stdout == "for everyone\n"
            assert private.returncode != 0 and "Permission denied" in private.stderr
        else:
            assert public.returncode != 0 and "Permission denied" in public.stderr


def _private_tree(root: Path) -> Path:
    """A 0700 directory holding a 0600 file and a 0700 script, as a careful publisher's
    umask leaves them."""
    (root / "secret").mkdir(parents=True)
    (root / "secret" / "data.bin").write_text("owner only\n")
    (root / "secret" / "data.bin").chmod(0o600)
    (root / "secret" / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (root / "secret" / "run.sh").chmod(0o700)
    (root / "secret").chmod(0o700)
    return root


@pytest.mark.parametrize(
    ("publish_flags", "mount_flags"),
    [
        ((), ("--readable-by-all",)),  # the mount presents them open
        (("--readable-by-all",), ()),  # the publisher recorded them open
        ((), ("--mount-uid", "65534")),  # the owner the kernel checks is nobody (65534)
        ((), ()),  # the control: as published, nobody is refused
    ],
)
def test_a_non_root_reader_reads_owner_only_files_through_the_any_uid_options(
    work: Path, publish_flags: tuple[str, ...], mount_flags: tuple[str, ...]
) -> None:
    src = _private_tree(work / "src")
    assert publish(work / "hub", "ds", src, *publish_flags) == "v1"
    with LocalStack() as stack:
        hub = stack.start_hub(work / "hub")
        extra = ("--allow-other", *mount_flags)
        stack.start_spoke(hub, work / "cache", work / "mnt", "64MiB", extra=extra)
        v1 = work / "mnt" / "ds" / "v1"
        read = _as_nobody("cat", str(v1 / "secret" / "data.bin"))
        ran = _as_nobody(str(v1 / "secret" / "run.sh"))
        mode = (v1 / "secret" / "data.bin").stat().st_mode & 0o777
        if not publish_flags and not mount_flags:
            assert read.returncode != 0 and "Permission denied" in read.stderr
            assert mode == 0o600
            return
        assert read.returncode == 0 and read.stdout == "owner only\n", read.stderr
        assert ran.returncode == 0 and ran.stdout == "ran\n", ran.stderr
        if mount_flags[:1] == ("--mount-uid",):
            assert mode == 0o600 and (v1 / "secret" / "data.bin").stat().st_uid == 65534
        else:
            assert mode == 0o644  # read for all added; nothing removed
        assert (v1 / "secret").stat().st_mode & 0o777 == (
            0o700 if mount_flags[:1] == ("--mount-uid",) else 0o755
        )
