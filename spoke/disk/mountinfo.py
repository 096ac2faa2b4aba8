"""The mount table of this process's mount namespace, from ``/proc/self/mountinfo``.

Read as text and never by ``stat``: a hung FUSE mount must not hang whoever asks. Each
line is ``mount-id parent-id major:minor root mount-point options ...`` with spaces,
tabs, newlines and backslashes in paths written as octal escapes (``\\040``); see
proc(5). The supervisor and the admin API ask whether a path is mounted
(:func:`is_mounted`), the mount which device backs its mountpoint (:func:`mounts`).
Mountpoints are compared as strings, resolved once before mounting
(:func:`resolve_mountpoint`); a dead FUSE mount is detached lazily (:func:`lazy_unmount`).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

MOUNTINFO = "/proc/self/mountinfo"


@dataclass(frozen=True, slots=True)
class Mount:
    """One line of the mount table.

    Attributes:
        device: The backing device as ``major:minor``.
        mountpoint: Where it is mounted (unescaped).
        fstype: The file system type (``ext4``, ``overlay``, ``fuse.strata``), the first
            field after the `` - `` separator; not compared.
    """

    device: str
    mountpoint: str
    fstype: str = field(default="", compare=False)


def mounts(path: str = MOUNTINFO) -> list[Mount]:
    """Every mount, in the table's order (a mount stacked on another comes after it).

    Raises:
        OSError: The table cannot be read.
    """
    table: list[Mount] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 4:
                after = fields.index("-", 5) + 1 if "-" in fields[5:] else len(fields)
                fstype = fields[after] if after < len(fields) else ""
                point = fields[4].encode().decode("unicode_escape")
                table.append(Mount(fields[2], point, fstype))
    return table


def mounted_paths() -> set[str]:
    """Mountpoints currently in this process's mount namespace (from /proc/self/mountinfo)."""
    return {m.mountpoint for m in mounts()}


def is_mounted(path: Path) -> bool:
    """True when ``path`` (absolute and already resolved) is a mountpoint.

    The path is compared as a string and never stat'ed: a hung FUSE mount there must not
    hang the caller. Resolve it once, before mounting.
    """
    return str(path) in mounted_paths()


def resolve_mountpoint(path: Path) -> Path:
    """``path`` made absolute with its parent's symlinks resolved, without touching ``path``
    itself (a dead FUSE mount there answers every stat with ENOTCONN)."""
    absolute = Path(os.path.abspath(path))
    return absolute.parent.resolve() / absolute.name


def lazy_unmount(path: Path) -> None:
    """Detach a (possibly dead) FUSE mount: ``fusermount3 -u -z``."""
    subprocess.run(
        ["fusermount3", "-u", "-z", str(path)],
        check=False,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
