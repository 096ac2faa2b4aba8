"""Walking a source tree without ever following a link or re-resolving a path.

A publish reads a tree that other local users may be able to write while it runs. A walk
that re-resolves ``root/a/b/file`` by name can be made to read anything: swap ``a`` for a
symlink to ``/etc`` between listing ``root`` and opening ``a/b/file``, and ``O_NOFOLLOW``
(which guards only the last component) does not help. So every step here is relative to
an open directory file descriptor (``openat(2)`` semantics through ``dir_fd``):

- a directory is entered with ``open(name, O_DIRECTORY | O_NOFOLLOW, dir_fd=parent)`` and
  its ``fstat`` must be the inode the listing saw (same device and inode number), so a
  component swapped for a symlink fails with ``ELOOP`` and one swapped for another
  directory is noticed; either way the publish stops with :class:`~hub.errors.SourceError`
  and nothing is committed;
- it is listed with ``scandir(fd)``, its members ``lstat``-ed relative to that descriptor;
- a file is opened with ``O_NOFOLLOW`` relative to its directory's descriptor and must
  ``fstat`` as the regular file the listing saw (:func:`open_file`);
- a symlink is read with ``readlink(name, dir_fd=...)`` (:func:`read_link`); its target is
  recorded, never followed. :func:`leaves_tree` says whether the target points outside the
  snapshot by its text (absolute, or ``..`` climbing above the root once normalised); the
  publish refuses those unless asked to allow them, and once the whole tree is staged
  also those that leave it through other symlinks (:mod:`hub.publish.symlinks`).

Mount points inside the tree are crossed, as a plain ``lstat`` walk would; the identity
check compares the device too, so a mount appearing mid-walk is a swap like any other.
The walk keeps one descriptor and one sorted listing per directory level being visited.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from hub.errors import SourceError

_FILE_TYPE_NAMES = {
    stat.S_IFIFO: "named pipe",
    stat.S_IFSOCK: "socket",
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
}

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class Member:
    """A member of the source tree, as the walk found it (``lstat``, not followed).

    Attributes:
        path: Manifest path, relative to the source root.
        mode: ``st_mode`` (type and permission bits).
        ino: Inode number, to notice a member replaced while publishing.
        mtime_ns: Modification time, nanoseconds since the Unix epoch.
        dev: Device number, with ``ino`` the member's identity.
        name: The last component of ``path``.
        dir_fd: Descriptor of the directory holding the member; valid only while the walk
            is suspended on this member (:func:`walk` closes it when it leaves the
            directory).
    """

    path: str
    mode: int
    ino: int
    mtime_ns: int
    dev: int = 0
    name: str = ""
    dir_fd: int = -1


def _utf8_name(relative: str) -> str:
    try:
        relative.encode("utf-8")
    except UnicodeEncodeError:
        raise SourceError(f"cannot publish {relative!r}: the name is not valid UTF-8") from None
    return relative


def _replaced(path: str) -> SourceError:
    return SourceError(f"cannot publish {path!r}: it was replaced while publishing")


def _listing(fd: int, prefix: str, where: str) -> list[tuple[bool, Member]]:
    """One directory's members as walk steps, in path order.

    Each member is a step ``(False, member)`` keyed by its name; a directory also gives a
    step ``(True, member)`` ("descend") keyed by its name plus ``/``. Sorting the keys by
    their UTF-8 bytes interleaves the descents exactly where the directory's contents fall
    in global path order: every path below ``d`` starts with ``d/`` and no sibling name
    starts with ``d/``, so ``d``'s contents sort after every sibling below ``d/`` and
    before every sibling above it (e.g. ``a``, ``a-b``, ``a/x``: ``-`` < ``/``).
    """
    keyed: list[tuple[bytes, bool, Member]] = []
    try:
        with os.scandir(fd) as members:
            for entry in members:
                relative = _utf8_name(prefix + entry.name)
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:  # listed by readdir, gone at lstat
                    raise _replaced(relative) from None
                kind = stat.S_IFMT(st.st_mode)
                if kind not in (stat.S_IFDIR, stat.S_IFREG, stat.S_IFLNK):
                    name = _FILE_TYPE_NAMES.get(kind, f"file type {kind:#o}")
                    raise SourceError(f"cannot publish {relative!r}: it is a {name}")
                member = Member(
                    relative, st.st_mode, st.st_ino, st.st_mtime_ns, st.st_dev, entry.name, fd
                )
                key = entry.name.encode("utf-8")
                keyed.append((key, False, member))
                if kind == stat.S_IFDIR:
                    keyed.append((key + b"/", True, member))
    except OSError as exc:
        raise SourceError(f"cannot read {where!r}: {exc.strerror or exc}") from exc
    keyed.sort(key=lambda step: step[0])
    return [(descend, member) for _, descend, member in keyed]


def _enter(member: Member) -> int:
    """Opens a directory the walk listed, relative to its parent, refusing a swap."""
    try:
        fd = os.open(member.name, _DIR_FLAGS, dir_fd=member.dir_fd)
    except OSError as exc:
        # ELOOP: a symlink now (O_NOFOLLOW); ENOTDIR: a file now; ENOENT: gone
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
            raise _replaced(member.path) from exc
        raise SourceError(f"cannot read {member.path!r}: {exc.strerror or exc}") from exc
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != (member.dev, member.ino):
        os.close(fd)
        raise _replaced(member.path)
    return fd


def walk(root: str | os.PathLike[str]) -> Iterator[Member]:
    """Yields every member below ``root`` in path order, one directory listing per level.

    Path order is ascending by the path's UTF-8 bytes (see :mod:`hub.snapshot.manifest`). The walk
    keeps one sorted listing and one open descriptor per directory level being visited,
    never the whole tree, and never resolves a path below ``root`` by name.

    Args:
        root: The source directory (resolved once, by name: the caller chose it).

    Yields:
        The members, in path order; symlinks are not followed. A member's
        :attr:`Member.dir_fd` is valid until the walk is resumed past it.

    Raises:
        SourceError: A directory cannot be read, a name is not UTF-8, a member is of an
            unsupported type (FIFO, socket, device), or a directory was replaced (by a
            symlink or another directory) between being listed and being entered.
    """
    try:
        top = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise SourceError(f"cannot read {str(root)!r}: {exc.strerror or exc}") from exc
    fds = [top]
    try:
        stack = [iter(_listing(top, "", str(root)))]
        while stack:
            step = next(stack[-1], None)
            if step is None:
                stack.pop()
                os.close(fds.pop())
                continue
            descend, member = step
            if descend:
                fd = _enter(member)
                fds.append(fd)
                stack.append(iter(_listing(fd, member.path + "/", member.path)))
            else:
                yield member
    finally:
        for fd in fds:
            os.close(fd)


def open_file(member: Member) -> int:
    """Opens a regular file the walk yielded, relative to its directory, for reading.

    Args:
        member: A regular-file member, while the walk is suspended on it.

    Returns:
        A descriptor of exactly the inode the listing saw (the caller closes it).

    Raises:
        SourceError: It cannot be opened, or it is no longer that regular file (a symlink
            now, another file, another type).
    """
    try:
        fd = os.open(member.name, _FILE_FLAGS, dir_fd=member.dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOENT):  # a symlink now (O_NOFOLLOW), or gone
            raise _replaced(member.path) from exc
        raise SourceError(f"cannot read {member.path!r}: {exc.strerror or exc}") from exc
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (member.dev, member.ino):
        os.close(fd)
        raise _replaced(member.path)
    return fd


def read_link(member: Member) -> str:
    """A symlink's target, read relative to its directory (never followed).

    Raises:
        SourceError: It cannot be read, was replaced (gone, no longer a symlink), or the
            target is not valid UTF-8.
    """
    try:
        target = os.readlink(member.name, dir_fd=member.dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.EINVAL):  # gone, or no longer a symlink
            raise _replaced(member.path) from exc
        raise SourceError(f"cannot read symlink {member.path!r}: {exc.strerror or exc}") from exc
    try:
        target.encode("utf-8")
    except UnicodeEncodeError:
        raise SourceError(
            f"cannot publish symlink {member.path!r}: its target is not valid UTF-8"
        ) from None
    return target


def leaves_tree(path: str, target: str) -> bool:
    """Whether symlink ``path``'s ``target`` points outside the snapshot tree.

    Outside means absolute, or climbing above the root once normalised lexically
    (``posixpath.normpath`` of the target joined to the link's directory). The check is
    lexical: it does not resolve other symlinks the target passes through, and a target
    that only climbs through a link (``s -> .`` then ``t -> s/../x``) is judged by its
    text; :func:`hub.publish.symlinks.escape` resolves it, once the whole tree is known.

    Args:
        path: The link's manifest path (relative to the root).
        target: Its target, as ``readlink`` returned it.

    Returns:
        True when the target leaves the tree.
    """
    if target.startswith("/"):
        return True
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    return resolved == ".." or resolved.startswith("../")
