"""Whether FUSE passthrough can be used here, checked before mounting
(:func:`unavailable_reason`): the patched pyfuse3, CAP_SYS_ADMIN, block files in the clear
and on a file system that can back files. Whether the kernel offers it is only known after
FUSE INIT (:meth:`fusemount.passthrough.Passthrough.negotiated`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import pyfuse3

from spoke.disk.mountinfo import mounts

CAP_SYS_ADMIN = 21  # bit of CapEff in /proc/self/status (capability.h)
STACKED_FILESYSTEMS = frozenset({"overlay", "aufs", "ecryptfs"})


def library_supports() -> bool:
    """True when the installed pyfuse3 has the passthrough calls (the patched build)."""
    return all(
        hasattr(pyfuse3, name)
        for name in ("passthrough_open", "passthrough_close", "passthrough_state")
    )


def has_cap_sys_admin(status: str = "/proc/self/status") -> bool:
    """True when this process holds CAP_SYS_ADMIN (``CapEff`` in ``status``)."""
    try:
        with open(status, encoding="ascii") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_SYS_ADMIN & 1)
    except (OSError, ValueError):
        pass
    return False


def filesystem_type(path: Path) -> str:
    """The type of the file system holding ``path`` (the innermost mount above it), from
    /proc/self/mountinfo; "" when unknown."""
    target = str(path.resolve())
    best, fstype = -1, ""
    with contextlib.suppress(OSError):
        for m in mounts():
            point = m.mountpoint.rstrip("/") or "/"
            inside = target == point or target.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= best:  # a later mount at the same point is on top
                best, fstype = len(point), m.fstype
    return fstype


def unavailable_reason(
    mode: str,
    cache_dir: Path,
    encrypted: bool,
    *,
    library: Callable[[], bool] = library_supports,
    privileged: Callable[[], bool] = has_cap_sys_admin,
    fstype: Callable[[Path], str] = filesystem_type,
) -> str:
    """Why passthrough cannot be used, checked before mounting; "" when it may be.

    Whether the kernel offers it is only known after FUSE INIT (:meth:`Passthrough.negotiated`).
    """
    if mode == "off":
        return "--passthrough off"
    if not library():
        return "pyfuse3 was built without passthrough (make setup builds it on libfuse >= 3.17)"
    if encrypted:
        return "block files are encrypted at rest (the kernel would read ciphertext)"
    if not privileged():
        return "no CAP_SYS_ADMIN (the kernel requires it to register backing files)"
    kind = fstype(cache_dir / "blocks" if (cache_dir / "blocks").exists() else cache_dir)
    if kind in STACKED_FILESYSTEMS:
        return f"the cache directory is on {kind} (a stacked file system cannot back files)"
    return ""
