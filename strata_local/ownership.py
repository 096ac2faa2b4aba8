"""Directories only this user controls: a private directory no other user can swap, fill
or point elsewhere.

The one implementation behind :mod:`hub.store.datadir` (the hub's data directory and blob store)
and :mod:`spoke.disk.hardening` (the spoke's cache directory): hub and spoke never import each
other, so what both need lives here; it imports nothing of Strata.

A process that keeps tokens, keys, an index and sockets in a directory must not use one
another local user can change. Another user (anyone but this process's user and root:
root can do anything whatever this module checks) can change what a path means if they
own a directory on it, or can write one without the sticky bit, or can write a sticky one
and own the entry there (sticky directories let an entry's owner remove it; ``/tmp`` and
``/dev/shm`` are sticky, so a directory of ours directly under them is safe). "Can write"
reads the mode bits: world-writable, or group-writable for a group that is not this
process's own (a Kubernetes volume shared through the pod's ``fsGroup`` is accepted);
POSIX ACLs beyond the mask are not read. So:

- :func:`open_private_dir` resolves the path the way the kernel does (path_resolution(7)):
  from ``/``, one component at a time, each relative to the descriptor of the directory
  before it (``openat(2)`` with ``O_NOFOLLOW``), following a symlink only after checking
  the directory holding it, at most :data:`MAX_LINKS` of them, and refuses the path when
  any directory it passes through lets another user replace the next step. The
  directory itself must be this user's (or root's, and then writable by no one else);
  it is opened ``O_DIRECTORY | O_NOFOLLOW`` and checked with ``fstat`` on that
  descriptor, so what was checked is what is used.
- :func:`make_private` narrows a directory of ours to 0700 (``fchmod`` on the
  descriptor): from then on only this user (and root) can add, remove or rename what is
  in it.
- :func:`check_members` looks at what was already in it (made while it was looser, or
  planted before): every entry must be this user's and never a symlink; files are
  narrowed to 0600, directories to 0700, and the entries of the subdirectories named are
  checked the same way. Nothing is followed and nothing another user owns is changed:
  the first such entry refuses the whole directory.

Everything refused raises :class:`UnsafePath` with one line naming what and why (the
caller adds which directory it was checking).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Collection, Iterator
from pathlib import Path

__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "MAX_LINKS",
    "UnsafePath",
    "check_members",
    "make_private",
    "open_private_dir",
    "private_dir",
]

DIR_MODE = 0o700
"""What a private directory is narrowed to."""

FILE_MODE = 0o600
"""What a file in a private directory is narrowed to."""

MAX_LINKS = 40
"""Most symlinks followed while resolving one path: Linux's limit (``MAXSYMLINKS``,
path_resolution(7)); more is refused as the kernel refuses it (``ELOOP``)."""

_PATH_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


class UnsafePath(Exception):
    """A directory (or something in it) that another local user could change; the message
    is one line naming the path and why."""


def _trusted(uid: int) -> bool:
    """This process's user, or root (who can do anything anyway)."""
    return uid in (0, os.geteuid())


def _others_may_write(st: os.stat_result) -> bool:
    """Whether a user other than the owner (and root) may write directory ``st``: world
    writable, or group writable for a group that is not this process's own."""
    mode = st.st_mode
    return bool(mode & stat.S_IWOTH) or bool(mode & stat.S_IWGRP and st.st_gid != os.getegid())


def _step_refused(
    directory: str, entry: str, st_dir: os.stat_result, st_entry: os.stat_result
) -> str | None:
    """Why another user could replace ``entry`` (``st_entry``) in ``directory``
    (``st_dir``), or None."""
    if not _trusted(st_dir.st_uid):
        return f"{directory} belongs to uid {st_dir.st_uid}, who could replace {entry}"
    if not _others_may_write(st_dir):
        return None
    mode = stat.S_IMODE(st_dir.st_mode)
    if not st_dir.st_mode & stat.S_ISVTX:
        return (
            f"{directory} is writable by other users (mode {mode:04o}, not sticky), "
            f"who could replace {entry}"
        )
    if not _trusted(st_entry.st_uid):  # sticky: the entry's owner may still replace it
        return (
            f"{entry} belongs to uid {st_entry.st_uid}, who could replace it "
            f"({directory} is sticky but writable by others)"
        )
    return None


def _join(parts: list[str]) -> str:
    return "/" + "/".join(parts)


def open_private_dir(path: str | os.PathLike[str]) -> int:
    """Resolve ``path`` as the kernel would, refusing any step another user could change,
    and open the directory it names.

    Args:
        path: The directory; a relative path is taken from the working directory.

    Returns:
        A descriptor of the directory (``O_RDONLY | O_DIRECTORY``); the caller closes it.

    Raises:
        UnsafePath: a directory on the way belongs to another user, or others may write
            it (and replace the next step: not sticky, or the entry there is theirs); more
            than :data:`MAX_LINKS` symlinks; the directory itself belongs to another user,
            or is root's and writable by others.
        FileNotFoundError: a component does not exist.
        NotADirectoryError: a component is not a directory.
        OSError: a component cannot be examined.
    """
    shown = os.fspath(path)
    pending = [p for p in reversed(os.path.abspath(shown).split("/")) if p]
    fds = [os.open("/", _PATH_FLAGS)]
    names: list[str] = []
    links = 0
    try:
        while pending:
            part = pending.pop()
            if part == ".":
                continue
            if part == "..":
                if names:  # ".." of "/" is "/"
                    os.close(fds.pop())
                    names.pop()
                continue
            parent = fds[-1]
            st = os.stat(part, dir_fd=parent, follow_symlinks=False)
            reason = _step_refused(_join(names), _join([*names, part]), os.fstat(parent), st)
            if reason is not None:
                raise UnsafePath(reason)
            if stat.S_ISLNK(st.st_mode):
                links += 1
                if links > MAX_LINKS:
                    raise UnsafePath(f"more than {MAX_LINKS} symlinks on the way (a loop?)")
                target = os.readlink(part, dir_fd=parent)
                if target.startswith("/"):
                    while len(fds) > 1:
                        os.close(fds.pop())
                    names.clear()
                pending.extend(p for p in reversed(target.split("/")) if p)
                continue
            if not stat.S_ISDIR(st.st_mode):
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), shown)
            fd = os.open(part, _PATH_FLAGS, dir_fd=parent)
            fds.append(fd)
            names.append(part)
            opened = os.fstat(fd)
            if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
                raise UnsafePath(f"{_join(names)} was replaced while it was checked")
        final = os.open(".", _DIR_FLAGS, dir_fd=fds[-1])
    finally:
        for fd in fds:
            os.close(fd)
    try:
        st = os.fstat(final)
        if st.st_uid != os.geteuid():
            if st.st_uid != 0:
                raise UnsafePath(
                    f"it belongs to uid {st.st_uid}, not to this user ({os.geteuid()})"
                )
            if _others_may_write(st):
                raise UnsafePath(
                    "it is root's and writable by other users "
                    f"(mode {stat.S_IMODE(st.st_mode):04o})"
                )
    except BaseException:
        os.close(final)
        raise
    return final


def make_private(fd: int) -> None:
    """Narrow the directory open as ``fd`` to 0700 when it is this user's and looser
    (a root-owned one, trusted by :func:`open_private_dir`, is left as it is).

    Raises:
        OSError: it cannot be changed.
    """
    st = os.fstat(fd)
    if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & ~DIR_MODE:
        os.fchmod(fd, stat.S_IMODE(st.st_mode) & DIR_MODE)


def _members(fd: int) -> Iterator[tuple[str, os.stat_result]]:
    """The entries of the directory open as ``fd``, ``lstat``-ed (one gone meanwhile is
    skipped: a temporary file renamed away)."""
    with os.scandir(fd) as entries:
        names = [entry.name for entry in entries]
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            yield name, os.stat(name, dir_fd=fd, follow_symlinks=False)


def _narrow_file(fd: int, name: str, st: os.stat_result) -> None:
    if not stat.S_IMODE(st.st_mode) & ~FILE_MODE:
        return
    mode = stat.S_IMODE(st.st_mode) & FILE_MODE
    if stat.S_ISREG(st.st_mode):
        with contextlib.suppress(FileNotFoundError):
            file = os.open(name, _FILE_FLAGS, dir_fd=fd)
            try:
                if os.fstat(file).st_ino == st.st_ino:
                    os.fchmod(file, mode)
            finally:
                os.close(file)
    else:  # a socket or a FIFO cannot be opened for fchmod; the directory is ours and 0700
        with contextlib.suppress(FileNotFoundError):
            os.chmod(name, mode, dir_fd=fd)


def check_members(fd: int, shown: str | os.PathLike[str], subdirs: Collection[str] = ()) -> None:
    """Check and narrow what a private directory holds, and what the named subdirectories
    hold, one level each.

    Every entry must be this user's and no symlink (never followed); files become 0600 at
    most, directories 0700. One exception at the top: a directory not named in
    ``subdirs`` (so not used) may be root's and is left alone (``lost+found`` at the root
    of a filesystem made for the cache). Call after :func:`make_private`, so nothing new
    can appear but from this user or root.

    Args:
        fd: The directory, from :func:`open_private_dir`.
        shown: Its path, for messages.
        subdirs: Names of subdirectories whose entries are checked too (a missing one is
            no error; one that is a symlink or no directory is refused).

    Raises:
        UnsafePath: an entry is a symlink or another user's (or a named subdirectory is
            not a directory).
        OSError: something cannot be examined or changed.
    """
    root = Path(shown)
    for name, st in _members(fd):
        where = root / name
        if stat.S_ISLNK(st.st_mode):
            raise UnsafePath(f"{where} is a symlink: remove it (never followed)")
        used = name in subdirs
        if st.st_uid != os.geteuid():
            if not (stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and not used):
                raise UnsafePath(
                    f"{where} belongs to uid {st.st_uid}, not to this user ({os.geteuid()})"
                )
            continue
        if not stat.S_ISDIR(st.st_mode):
            if used:
                raise UnsafePath(f"{where} is not a directory")
            _narrow_file(fd, name, st)
            continue
        sub = _open_member_dir(fd, name, where, st)
        if sub is None:
            continue
        try:
            make_private(sub)
            if used:
                _check_inner(sub, where)
        finally:
            os.close(sub)


def _open_member_dir(fd: int, name: str, where: Path, st: os.stat_result) -> int | None:
    try:
        sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
    except FileNotFoundError:
        return None
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafePath(f"{where} was replaced while it was checked") from None
        raise
    opened = os.fstat(sub)
    if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
        os.close(sub)
        raise UnsafePath(f"{where} was replaced while it was checked")
    return sub


def _check_inner(fd: int, shown: Path) -> None:
    """One level inside a used subdirectory: every entry this user's, no symlink;
    directories (the block store's fan-out) 0700, files 0600."""
    for name, st in _members(fd):
        where = shown / name
        if stat.S_ISLNK(st.st_mode):
            raise UnsafePath(f"{where} is a symlink: remove it (never followed)")
        if st.st_uid != os.geteuid():
            raise UnsafePath(
                f"{where} belongs to uid {st.st_uid}, not to this user ({os.geteuid()})"
            )
        if stat.S_ISDIR(st.st_mode):
            sub = _open_member_dir(fd, name, where, st)
            if sub is not None:
                try:
                    make_private(sub)
                finally:
                    os.close(sub)
        else:
            _narrow_file(fd, name, st)


def private_dir(path: str | os.PathLike[str], subdirs: Collection[str] = ()) -> None:
    """:func:`open_private_dir`, :func:`make_private` and :func:`check_members` in one.

    Raises:
        UnsafePath, OSError: as those do.
    """
    fd = open_private_dir(path)
    try:
        make_private(fd)
        check_members(fd, path, subdirs)
    finally:
        os.close(fd)
