"""The node's mount table and the three mount calls the plugin makes: bind, make read-only,
unmount (on paths :mod:`csi.targets` makes: ``/proc/self/fd/N``, not names).

The table is :mod:`strata_local.mountinfo`'s (read as text, never by ``stat``: a dead
FUSE mount must not hang the plugin). For a bind mount, ``root`` is the directory of the
source file system that was bound: a published volume of ``f3`` v3 reads ``/f3/v3`` on
the spoke mount's device, which is how the plugin tells what a target holds.

The calls are mount(2) and umount2(2) through the C library (``ctypes``), so an error is
an ``OSError`` with the kernel's errno, not a parsed message of ``mount(8)``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path

from strata_local.mountinfo import MOUNTINFO, Mount, mounts, resolve_mountpoint

__all__ = ["MOUNTINFO", "Mount", "bind", "make_read_only", "mounted_at", "mounts"]
__all__ += ["detach", "resolve_target", "unmount"]

# <sys/mount.h> (Linux): mount(2) flags
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MNT_DETACH = 0x2
UMOUNT_NOFOLLOW = 0x8

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong]
_libc.mount.argtypes += [ctypes.c_void_p]
_libc.mount.restype = ctypes.c_int
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.umount2.restype = ctypes.c_int


def mounted_at(path: Path) -> Mount | None:
    """The topmost mount whose mountpoint is ``path`` (absolute, resolved), or None."""
    found = [m for m in mounts() if m.mountpoint == str(path)]
    return found[-1] if found else None


def resolve_target(path: str) -> Path:
    """``path`` made absolute with its parent's symlinks resolved, without touching ``path``
    itself (:func:`strata_local.mountinfo.resolve_mountpoint`)."""
    return resolve_mountpoint(path)


def _check(result: int, what: str, path: Path) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}", str(path))


def bind(source: Path, target: Path) -> None:
    """Bind-mount the directory ``source`` on ``target`` (read-write until
    :func:`make_read_only`: mount(2), "Creating a bind mount", ignores ``MS_RDONLY`` with
    ``MS_BIND`` on the first call; the spoke's mount shown meanwhile is read-only itself).

    Raises:
        OSError: mount(2) refused (``EPERM`` without ``CAP_SYS_ADMIN``, ``ENOENT`` …).
    """
    _check(
        _libc.mount(str(source).encode(), str(target).encode(), None, MS_BIND, None),
        "bind mount",
        target,
    )


def make_read_only(source: Path, bound: Path) -> None:
    """Remount the bind mount whose root ``bound`` names read-only, ``nosuid`` and
    ``nodev`` (also ``noexec`` when ``source`` has it).

    Raises:
        OSError: mount(2) refused.
    """
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV
    if os.statvfs(source).f_flag & os.ST_NOEXEC:
        flags |= MS_NOEXEC
    _check(_libc.mount(None, str(bound).encode(), None, flags, None), "remount ro", bound)


def unmount(target: Path) -> None:
    """Unmount ``target`` (umount2(2) with ``UMOUNT_NOFOLLOW``: a symlink there is not
    followed; a mount still in use stays, ``EBUSY``).

    Raises:
        OSError: umount2(2) refused.
    """
    _check(_libc.umount2(str(target).encode(), UMOUNT_NOFOLLOW), "unmount", target)


def detach(mounted: Path) -> None:
    """Detach the mount on the directory ``mounted`` names (umount2(2) ``MNT_DETACH``;
    given ``/proc/self/fd/N`` of that directory, the kernel reaches the mount stacked on
    it wherever the directory now is): for a bind the plugin just made and takes back.

    Raises:
        OSError: umount2(2) refused.
    """
    _check(_libc.umount2(str(mounted).encode(), MNT_DETACH), "detach", mounted)
