"""``strata_local.ownership``: a private directory is refused when another user could change it
(theirs, on a path they could replace, holding their files or a symlink), and accepted
where only this user and root could (a directory of ours directly under a sticky one)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from strata_local.ownership import MAX_LINKS, UnsafePath, open_private_dir, private_dir

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files away")

NOBODY = 65534


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _sticky(path: Path) -> Path:
    """A root-owned, world-writable, sticky directory, as /tmp and /dev/shm are."""
    path.mkdir()
    os.chmod(path, 0o1777)
    return path


def test_a_directory_of_ours_under_a_sticky_one_is_accepted_and_narrowed(tmp_path: Path) -> None:
    shared = _sticky(tmp_path / "shm")
    cache = shared / "cache"
    (cache / "index").mkdir(parents=True)
    (cache / "index" / "data.mdb").write_bytes(b"")
    os.chmod(cache, 0o755)
    os.chmod(cache / "index" / "data.mdb", 0o644)
    private_dir(cache, subdirs=("index",))
    assert (_mode(cache), _mode(cache / "index"), _mode(cache / "index" / "data.mdb")) == (
        0o700,
        0o700,
        0o600,
    )


def test_another_users_directory_under_a_sticky_one_is_refused(tmp_path: Path) -> None:
    """The probe's case: ``/dev/shm/evil``, made by another user."""
    evil = _sticky(tmp_path / "shm") / "evil"
    evil.mkdir()
    os.chmod(evil, 0o777)
    os.chown(evil, NOBODY, NOBODY)
    with pytest.raises(UnsafePath, match=f"{evil} belongs to uid {NOBODY}, who could replace it"):
        open_private_dir(evil)
    assert _mode(evil) == 0o777  # nothing of theirs is changed


def test_a_directory_of_ours_given_away_after_its_parent_check_is_refused(tmp_path: Path) -> None:
    mine = tmp_path / "cache"
    mine.mkdir()
    os.chown(mine, NOBODY, NOBODY)
    with pytest.raises(UnsafePath, match=f"it belongs to uid {NOBODY}, not to this user"):
        open_private_dir(mine)


def test_a_non_sticky_world_writable_parent_is_refused(tmp_path: Path) -> None:
    (tmp_path / "open").mkdir()
    os.chmod(tmp_path / "open", 0o777)
    (tmp_path / "open" / "cache").mkdir()
    with pytest.raises(UnsafePath, match="writable by other users \\(mode 0777, not sticky\\)"):
        open_private_dir(tmp_path / "open" / "cache")


def test_a_parent_writable_by_another_group_is_refused_by_our_own_group_accepted(
    tmp_path: Path,
) -> None:
    parent = tmp_path / "group"
    (parent / "cache").mkdir(parents=True)
    os.chmod(parent, 0o775)
    os.chown(parent, 0, NOBODY)  # nogroup may write it
    with pytest.raises(UnsafePath, match="writable by other users"):
        open_private_dir(parent / "cache")
    os.chown(parent, 0, os.getegid())  # our own group (a volume's fsGroup)
    os.close(open_private_dir(parent / "cache"))


def test_an_intermediate_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    (theirs / "deep" / "cache").mkdir(parents=True)
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(UnsafePath, match=f"{theirs} belongs to uid {NOBODY}"):
        open_private_dir(theirs / "deep" / "cache")


def test_symlinks_on_the_way_are_followed_only_where_nobody_else_could_change_them(
    tmp_path: Path,
) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to("real")  # ours, in a directory of ours: followed
    fd = open_private_dir(tmp_path / "link")
    try:
        assert os.fstat(fd).st_ino == real.stat().st_ino
    finally:
        os.close(fd)
    shared = _sticky(tmp_path / "shm")
    (shared / "their-link").symlink_to(real)
    os.chown(shared / "their-link", NOBODY, NOBODY, follow_symlinks=False)
    with pytest.raises(UnsafePath, match="their-link belongs to uid 65534"):
        open_private_dir(shared / "their-link")


def test_a_symlink_loop_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    with pytest.raises(UnsafePath, match=f"more than {MAX_LINKS} symlinks"):
        open_private_dir(tmp_path / "a")


@pytest.mark.parametrize("where", ["admin.token", "index/data.mdb", "blocks/ab", "index"])
def test_an_entry_of_another_user_is_refused_and_left_alone(tmp_path: Path, where: str) -> None:
    cache = tmp_path / "cache"
    for sub in ("index", "blocks/ab"):
        (cache / sub).mkdir(parents=True)
    for name in ("admin.token", "index/data.mdb"):
        (cache / name).write_text("theirs")
    os.chmod(cache / where, 0o666 if (cache / where).is_file() else 0o777)
    os.chown(cache / where, NOBODY, NOBODY)
    with pytest.raises(UnsafePath, match=f"{cache / where} belongs to uid {NOBODY}"):
        private_dir(cache, subdirs=("index", "blocks"))
    assert (cache / where).stat().st_uid == NOBODY
    assert _mode(cache / where) in (0o666, 0o777)


@pytest.mark.parametrize("where", ["admin.token", "index/data.mdb", "index"])
def test_a_symlink_in_it_is_refused_and_never_followed(tmp_path: Path, where: str) -> None:
    cache, outside = tmp_path / "cache", tmp_path / "outside"
    (cache / "index").mkdir(parents=True)
    outside.mkdir()
    os.chmod(outside, 0o755)
    if where == "index":
        (cache / "index").rmdir()
    (cache / where).symlink_to(outside)
    with pytest.raises(UnsafePath, match=f"{cache / where} is a symlink"):
        private_dir(cache, subdirs=("index",))
    assert _mode(outside) == 0o755
