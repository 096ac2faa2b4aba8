"""The mount table of this process's mount namespace, from ``/proc/self/mountinfo``.

Parsed by :mod:`strata_local.mountinfo` (as text, never by ``stat``). The supervisor and
the admin API ask whether a path is mounted (:func:`is_mounted`), the mount which device
backs its mountpoint (:func:`mounts`). Mountpoints are compared as strings, resolved once
before mounting (:func:`resolve_mountpoint`); a dead FUSE mount is detached lazily
(:func:`lazy_unmount`).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from strata_local.mountinfo import MOUNTINFO, Mount, mounts, resolve_mountpoint

__all__ = [
    "MOUNTINFO",
    "Mount",
    "is_mounted",
    "lazy_unmount",
    "mounted_paths",
    "mounts",
    "resolve_mountpoint",
]


def mounted_paths() -> set[str]:
    """Mountpoints currently in this process's mount namespace (from /proc/self/mountinfo)."""
    return {m.mountpoint for m in mounts()}


def is_mounted(path: Path) -> bool:
    """True when ``path`` (absolute and already resolved) is a mountpoint.

    The path is compared as a string and never stat'ed: a hung FUSE mount there must not
    hang the caller. Resolve it once, before mounting.
    """
    return str(path) in mounted_paths()


def lazy_unmount(path: Path) -> None:
    """Detach a (possibly dead) FUSE mount: ``fusermount3 -u -z``."""
    subprocess.run(
        ["fusermount3", "-u", "-z", str(path)],
        check=False,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
