"""Access control: only the mounting user by default; with --allow-other, the kernel
checks the manifest's file modes (default_permissions)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.local import LocalStack
from tests.support import publish, requires_fuse

pytestmark = [pytest.mark.fuse, requires_fuse]


def _as_nobody(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["runuser", "-u", "nobody", "--", *cmd], capture_output=True, text=True)


@pytest.fixture
def work() -> Iterator[Path]:
    """A directory every user can traverse (pytest's tmp_path is private to root)."""
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs root and runuser to act as another user")
    path = Path(tempfile.mkdtemp(prefix="strata-access-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


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
