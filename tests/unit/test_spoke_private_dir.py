"""``private_socket_dir``: the directory gRPC's socket lives in is made 0700, a looser one
of ours is tightened, and a link, a file or another user's directory is refused."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from spoke.disk.hardening import UnsafeDirectory, private_socket_dir


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_it_is_made_owner_only_whatever_the_umask(tmp_path: Path) -> None:
    previous = os.umask(0)
    try:
        assert private_socket_dir(tmp_path / ".grpc") == tmp_path / ".grpc"
    finally:
        os.umask(previous)
    assert _mode(tmp_path / ".grpc") == 0o700


def test_a_looser_one_of_ours_is_tightened(tmp_path: Path) -> None:
    (tmp_path / ".grpc").mkdir()
    os.chmod(tmp_path / ".grpc", 0o777)
    private_socket_dir(tmp_path / ".grpc")
    assert _mode(tmp_path / ".grpc") == 0o700


def test_a_link_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o755)
    os.chmod(target, 0o755)
    (tmp_path / ".grpc").symlink_to(target)
    with pytest.raises(UnsafeDirectory, match="is a symlink"):
        private_socket_dir(tmp_path / ".grpc")
    assert _mode(target) == 0o755


def test_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / ".grpc").write_text("")
    with pytest.raises(UnsafeDirectory, match="is not a directory"):
        private_socket_dir(tmp_path / ".grpc")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory away")
def test_another_users_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / ".grpc").mkdir(mode=0o700)
    os.chown(tmp_path / ".grpc", 65534, 65534)  # nobody
    with pytest.raises(UnsafeDirectory, match="belongs to uid 65534"):
        private_socket_dir(tmp_path / ".grpc")
