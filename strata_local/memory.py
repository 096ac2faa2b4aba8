"""glibc's malloc arenas, which hub and spoke daemons both limit before their threads start.

glibc gives each thread that allocates its own arena (up to 8 per core) and does not reuse
memory freed in one arena in another, so each flood of connections that gRPC core's
threads served left a daemon larger than the last. With :data:`MALLOC_ARENAS` arenas
(``mallopt(M_ARENA_MAX)``, glibc's ``glibc.malloc.arena_max`` tunable; mallopt(3)) the
same floods level off after the first.
"""

from __future__ import annotations

import ctypes
import ctypes.util

MALLOC_ARENAS = 2
"""glibc malloc arenas of a hub ``serve`` or spoke daemon process."""

_M_ARENA_MAX = -8  # glibc malloc.h


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
