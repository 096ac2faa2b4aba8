"""The spoke's own file modes and its admin token, whatever the caller's umask.

A cache directory holds manifests (file names of datasets, possibly from directories other
users cannot list), block bytes, the daemon's socket (which makes the spoke fetch) and the
admin token. So the daemon, and ``strata-spoke run`` before it starts anything, set the
umask to 077 (new directories 0700, new files and the socket 0600) and :func:`secure_cache_dir`
tightens what an older version or another umask left behind. The mount reads block files
as the same user, so nothing needs more than owner access; other users read data only
through the mount (``--allow-other``), never from the cache directory.

Modes only help in a directory no other user controls, so a cache directory another user
owns, could replace (a directory on the way is theirs, or theirs to write) or has put
something in (a token, the LMDB files, a symlink) is refused before anything is read or
written there (:func:`secure_cache_dir`, over the shared :mod:`strata_local.ownership`): the
attacker's admin token is never used, nothing is written into their files, and the
daemon's socket never sits where they could move it.

gRPC's own listener cannot check who connects (its local credentials for UNIX sockets
never read ``SO_PEERCRED``; ``spoke.serve.frontdoor`` does, on ``daemon.sock``), so it listens in
a directory only this user may enter (:func:`private_socket_dir`): the kernel refuses
anyone else at path resolution, whatever the socket's own mode.

The admin API always has a token: ``--admin-token-file``, or else ``CACHE_DIR/admin.token``,
generated (32 random bytes, URL-safe base64) at first start with mode 0600 and kept across
restarts; ``strata-spoke`` commands given ``--cache-dir`` read it there.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path

from spoke.disk.layout import CacheLayout
from strata_local.atomic import write_atomic
from strata_local.ownership import UnsafePath, check_members, make_private, open_private_dir

PRIVATE_UMASK = 0o077
DIR_MODE = 0o700
FILE_MODE = 0o600

USED_SUBDIRS = ("blocks", "index", ".grpc")
"""The cache directory's subdirectories whose entries the spoke uses (and so checks)."""


class UnsafeDirectory(RuntimeError):
    """A private directory is a link, not a directory, or another user's; or, for the
    cache directory, something on the way to it or in it is another user's to change."""


def private_umask() -> int:
    """Set the process umask to 077 (children inherit it); returns the previous one."""
    return os.umask(PRIVATE_UMASK)


def secure_cache_dir(layout: CacheLayout) -> None:
    """Refuse a cache directory another local user could change, and narrow ours to
    owner-only (:mod:`strata_local.ownership`).

    Refused: a directory on the way to it that another user owns or may write (unless
    sticky with the next step ours, as under ``/tmp`` and ``/dev/shm``); the cache
    directory itself, ``blocks/`` (and its fan-out directories), ``index/`` (LMDB's
    ``data.mdb`` and ``lock.mdb``), ``.grpc/`` or any file at the top (tokens, pid and URL
    files, locks, the audit log, the socket) if another user's, or a symlink (never
    followed). Then directories are made 0700 and files 0600 (block files are written
    0600 already). The supervisor, the daemon and the mount all call this before they
    read or write anything there.

    Raises:
        UnsafeDirectory: the cache directory, or something in it, is not this user's to
            trust (one line naming the path and why).
        OSError: the cache directory cannot be read or changed.
    """
    try:
        fd = open_private_dir(layout.root)
        try:
            make_private(fd)
            if os.path.lexists(layout.private_dir):  # its own check, its own message
                private_socket_dir(layout.private_dir)
            check_members(fd, layout.root, subdirs=USED_SUBDIRS)
        finally:
            os.close(fd)
    except UnsafePath as err:
        raise UnsafeDirectory(f"cache dir {layout.root}: {err}") from None


def private_socket_dir(path: Path) -> Path:
    """Create ``path`` as an owner-only directory (0700), or verify the one there: a real
    directory (never a link), owned by this user, tightened to 0700 if looser.

    Returns:
        ``path``.

    Raises:
        UnsafeDirectory: ``path`` is a symlink, not a directory, or owned by another user
            (someone who could write the cache directory put it there: refuse to serve).
        OSError: it cannot be created, opened or changed.
    """
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, DIR_MODE)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafeDirectory(
                f"{path} is {'a symlink' if path.is_symlink() else 'not a directory'}: "
                "remove it; the daemon makes it as a private directory"
            ) from None
        raise
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise UnsafeDirectory(
                f"{path} belongs to uid {st.st_uid}, not to this user ({os.geteuid()}): remove it"
            )
        if stat.S_IMODE(st.st_mode) != DIR_MODE:
            os.fchmod(fd, DIR_MODE)
    finally:
        os.close(fd)
    return path


def admin_token_path(layout: CacheLayout) -> Path:
    """Where a generated admin token lives: ``CACHE_DIR/admin.token``."""
    return layout.root / "admin.token"


def ensure_admin_token(layout: CacheLayout) -> str:
    """The generated admin token, made now (0600, atomically) if there is none yet.

    Raises:
        OSError: the file cannot be read or written.
    """
    path = admin_token_path(layout)
    with contextlib.suppress(FileNotFoundError):
        token = path.read_text().strip()
        if token:
            return token  # checked and narrowed by secure_cache_dir
    token = secrets.token_urlsafe(32)
    write_atomic(path, (token + "\n").encode())  # FILE_MODE
    return token
