"""Who owns a cache directory: an exclusive ``flock`` held for a process's lifetime.

Two spokes on one cache directory would both write its index and block files and delete
each other's socket. ``strata-spoke run`` holds ``CACHE_DIR/spoke.lock`` and its daemon
``CACHE_DIR/daemon.lock`` (a daemon restarted by the supervisor takes it again; the
kernel drops a lock when its holder dies, however it dies). The holder's pid is written
in the file so the refusal can name it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path


class CacheInUse(OSError):
    """Another process holds the cache directory's lock."""


def hold(path: Path, what: str) -> int:
    """Take the exclusive lock ``path`` for this process and write its pid there.

    Returns:
        The open descriptor; the lock lasts until it is closed or the process exits.

    Raises:
        CacheInUse: another process holds it (the message names its pid).
        OSError: the file cannot be opened.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            os.close(fd)
            raise
        holder = ""
        with contextlib.suppress(OSError, ValueError, IndexError):
            holder = f" (pid {int(os.pread(fd, 32, 0).split()[0])})"
        os.close(fd)
        raise CacheInUse(
            errno.EBUSY, f"cache dir {path.parent} is in use by another {what}{holder}"
        ) from None
    claim(fd)
    return fd


def claim(fd: int) -> None:
    """Write this process's pid into a lock it was handed (a copy of another process's
    descriptor: the ``flock`` belongs to the open file, so it passed with it)."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


def holder(path: Path) -> int | None:
    """The pid of the live process holding the lock ``path``; None when nobody holds it
    (or the file is missing, or the holder's pid cannot be read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                return None
            with contextlib.suppress(OSError, ValueError, IndexError):
                return int(os.pread(fd, 32, 0).split()[0])
            return None
        return None  # we got it: nobody else holds it (closing the fd drops ours)
    finally:
        os.close(fd)
