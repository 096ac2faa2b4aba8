"""What the daemon may hold open for others: its open-file limit, the caps on connections
to its admin API and peer port fitted under that limit, and glibc's malloc arenas.

- **Open files.** The daemon raises its soft ``RLIMIT_NOFILE`` to the hard limit at start
  (as the mount does; systemd's default soft limit is 1024), then fits the caps under it:
  the admin API at most :data:`ADMIN_MAX_CONNECTIONS` and an eighth of the limit, the
  peer port at most ``--peer-max-connections`` and half of it, leaving the rest to block
  files, the index, the hub and the mount. A cap lowered to fit is logged once at start.
  Connections beyond a cap are closed as they arrive, so the daemon never runs out of
  descriptors to a flood of idle connections (reads of cold blocks then stalled, and
  asyncio logged its accept failure hundreds of thousands of times a minute).
- **Malloc arenas.** glibc gives each thread that allocates its own arena (up to 8 per
  core) and does not reuse memory freed in one arena in another, so each flood of
  connections that gRPC core's threads served left the daemon larger than the last. With
  :data:`MALLOC_ARENAS` (``mallopt(M_ARENA_MAX)``, glibc's ``glibc.malloc.arena_max``
  tunable) the same floods level off after the first.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import resource
from dataclasses import dataclass

log = logging.getLogger(__name__)

ADMIN_MAX_CONNECTIONS = 256
"""Most connections open to the admin API at once (operators, Prometheus, probes, the
training jobs' hint posts need a few each)."""

MALLOC_ARENAS = 2
"""glibc malloc arenas of the daemon (see the module docstring)."""

_M_ARENA_MAX = -8  # glibc malloc.h


def raise_open_files() -> int:
    """Raise this process's soft open-file limit to its hard limit.

    Returns:
        The soft limit now (unchanged where it cannot be raised).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (OSError, ValueError) as err:
            log.debug("cannot raise the open-file limit to %s: %s", target, err)
    return int(soft)


@dataclass(frozen=True)
class ConnectionCaps:
    """Connection caps that fit the open-file limit.

    Attributes:
        admin: Most admin API connections open at once.
        peer: Most peer port connections open at once.
    """

    admin: int
    peer: int

    @classmethod
    def fit(cls, open_files: int, peer: int, admin: int = ADMIN_MAX_CONNECTIONS) -> ConnectionCaps:
        """The caps asked for, lowered (with a warning) to fit ``open_files``.

        Args:
            open_files: The soft open-file limit.
            peer: The peer port cap asked for (``--peer-max-connections``; 0: no peer port).
            admin: The admin API cap asked for.
        """
        fitted = cls(
            admin=max(8, min(admin, open_files // 8)),
            peer=max(8, min(peer, open_files // 2)) if peer else 0,
        )
        if fitted.peer < peer:
            log.warning(
                "open-file limit %d: at most %d peer port connections (asked for %d); raise "
                "the limit (LimitNOFILE, ulimit -n) for more",
                open_files,
                fitted.peer,
                peer,
            )
        return fitted


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Limit glibc's malloc to ``arenas`` arenas; call it before threads start.

    Args:
        arenas: Most arenas.

    Returns:
        True when set; False where the C library is not glibc (nothing changes).
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 (only glibc has it; musl's mallopt is a no-op)
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_ARENA_MAX, arenas))
