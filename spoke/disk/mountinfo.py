"""The mount table of this process's mount namespace, from ``/proc/self/mountinfo``.

Read as text and never by ``stat``: a hung FUSE mount must not hang whoever asks. Each
line is ``mount-id parent-id major:minor root mount-point options ...`` with spaces,
tabs, newlines and backslashes in paths written as octal escapes (``\\040``); see
proc(5). The supervisor asks whether a path is mounted, the mount which device backs its
mountpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
