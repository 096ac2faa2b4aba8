"""The spoke's own file modes and its admin token, whatever the caller's umask.

A cache directory holds manifests (file names of datasets, possibly from directories other
users cannot list), block bytes, the daemon's socket (which makes the spoke fetch) and the
admin token. So the daemon, and ``strata-spoke run`` before it starts anything, set the
umask to 077 (new directories 0700, new files and the socket 0600) and :func:`secure_cache_dir`
tightens what an older version or another umask left behind. The mount reads block files
as the same user, so nothing needs more than owner access; other users read data only
through the mount (``--allow-other``), never from the cache directory.

The admin API always has a token: ``--admin-token-file``, or else ``CACHE_DIR/admin.token``,
generated (32 random bytes, URL-safe base64) at first start with mode 0600 and kept across
restarts; ``strata-spoke`` commands given ``--cache-dir`` read it there.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

from spoke.layout import CacheLayout

PRIVATE_UMASK = 0o077
DIR_MODE = 0o700
FILE_MODE = 0o600


def private_umask() -> int:
    """Set the process umask to 077 (children inherit it); returns the previous one."""
    return os.umask(PRIVATE_UMASK)


def _tighten(path: Path, mode: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid():
            return  # never follow a link, never touch what another user owns
        if stat.S_IMODE(st.st_mode) & ~mode:
            os.chmod(path, stat.S_IMODE(st.st_mode) & mode)


def secure_cache_dir(layout: CacheLayout) -> None:
    """Tighten the cache directory to owner-only: 0700 directories (the root, ``blocks/``,
    its fan-out directories, ``index/``), 0600 files at the top, in ``index/`` (LMDB's
    ``data.mdb`` and ``lock.mdb``) and the socket. Block files are written 0600 already.

    Raises:
        OSError: the cache directory cannot be read or changed.
    """
    _tighten(layout.root, DIR_MODE)
    for sub in (layout.blocks_dir, layout.index_dir):
        _tighten(sub, DIR_MODE)
    with contextlib.suppress(FileNotFoundError), os.scandir(layout.blocks_dir) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                _tighten(Path(entry.path), DIR_MODE)
    for directory in (layout.root, layout.index_dir):
        with contextlib.suppress(FileNotFoundError), os.scandir(directory) as entries:
            for entry in entries:
                if not entry.is_dir(follow_symlinks=False):
                    _tighten(Path(entry.path), FILE_MODE)


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
            _tighten(path, FILE_MODE)
            return token
    token = secrets.token_urlsafe(32)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, FILE_MODE)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
    os.replace(tmp, path)
    return token
