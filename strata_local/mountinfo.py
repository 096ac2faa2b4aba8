"""The mount table of a mount namespace, from ``/proc/PID/mountinfo``, read as text.

Never by ``stat``: a dead FUSE mount answers every ``stat`` with ``ENOTCONN`` and a hung
one never answers, and neither may hang whoever asks (the spoke's supervisor and mount,
the drain, the CSI plugin). Each line is ``mount-id parent-id major:minor root
mount-point options ... - fstype source super-options``, with spaces, tabs, newlines and
backslashes in paths written as octal escapes (proc(5), "/proc/pid/mountinfo"). For a
bind mount, ``root`` is the directory of the source file system that was bound, and
``major:minor`` the source's.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

MOUNTINFO = "/proc/self/mountinfo"


@dataclass(frozen=True, slots=True)
class Mount:
    """One line of the mount table; two are equal when device and mountpoint are.

    Attributes:
        device: The backing device as ``major:minor``; a bind mount shares its source's.
        mountpoint: Where it is mounted (unescaped).
        fstype: The first field after the `` - `` separator (``ext4``, ``fuse.strata``).
        root: The directory of the file system mounted here (``/`` for a whole one).
        options: The per-mount options (``ro``, ``nosuid`` …).
    """

    device: str
    mountpoint: str
    fstype: str = field(default="", compare=False)
    root: str = field(default="/", compare=False)
    options: frozenset[str] = field(default=frozenset(), compare=False)


_OCTAL = re.compile(rb"\\([0-7]{3})")


def _unescape(raw: bytes) -> str:
    """A path field as Python names paths: the kernel's octal escapes (space, tab, newline,
    backslash) undone on the bytes, which are then decoded as the file system's names are
    (``os.fsdecode``: UTF-8, other bytes kept as surrogates), so a path with non-ASCII
    names compares equal to the ``Path`` the caller holds."""
    return os.fsdecode(_OCTAL.sub(lambda m: bytes([int(m[1], 8)]), raw))


def mounts(path: str = MOUNTINFO) -> list[Mount]:
    """Every mount of the table at ``path``, in its order (a mount stacked on another comes
    after it); lines too short to hold a mountpoint are skipped.

    Raises:
        OSError: The table cannot be read.
    """
    table: list[Mount] = []
    with open(path, "rb") as f:  # bytes: names need not be UTF-8
        for line in f:
            raw = line.split()
            fields = [os.fsdecode(field) for field in raw]
            if len(fields) <= 4:
                continue
            after = fields.index("-", 5) + 1 if "-" in fields[5:] else len(fields)
            table.append(
                Mount(
                    device=fields[2],
                    mountpoint=_unescape(raw[4]),
                    fstype=fields[after] if after < len(fields) else "",
                    root=_unescape(raw[3]),
                    options=frozenset(fields[5].split(",")) if len(fields) > 5 else frozenset(),
                )
            )
    return table


def resolve_mountpoint(path: str | os.PathLike[str]) -> Path:
    """``path`` made absolute with its parent's symlinks resolved, without touching ``path``
    itself (a dead FUSE mount there answers every ``stat`` with ``ENOTCONN``)."""
    absolute = Path(os.path.abspath(path))
    return absolute.parent.resolve() / absolute.name
