"""Whether the installed pyfuse3 answers the kernel's lock requests itself, checked when
the mount starts (:func:`warn_unless_granted`).

The patched build (``native/pyfuse3-passthrough.patch``) grants every ``flock``, ``fcntl``
record lock and OFD lock at once, in C: the snapshots are immutable and the mount is
read-only, so exclusion protects nothing. Without it the kernel keeps the locks itself, per
inode, shared by every process on the node that opens the file (CSI binds into pods
included): one reader holding ``flock(LOCK_EX)`` makes every other reader's
``flock(LOCK_SH | LOCK_NB)`` fail (the open of HDF5, netCDF4) and a blocking one wait.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pyfuse3

log = logging.getLogger(__name__)

KERNEL_LOCKS_WARNING = (
    "pyfuse3 was built without the lock handlers (make setup builds it with "
    "native/pyfuse3-passthrough.patch): the kernel keeps file locks on this mount itself, "
    "so one reader's flock or fcntl lock can block every other reader of the same file"
)


def library_grants_locks() -> bool:
    """True when the installed pyfuse3 grants lock requests itself (the patched build)."""
    granted = getattr(pyfuse3, "locks_granted", None)
    return bool(granted()) if callable(granted) else False


def warn_unless_granted(library: Callable[[], bool] = library_grants_locks) -> bool:
    """Log one WARNING when the mount would leave locks to the kernel; returns whether
    the library grants them."""
    granted = library()
    if not granted:
        log.warning(KERNEL_LOCKS_WARNING)
    return granted
