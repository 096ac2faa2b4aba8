"""glibc's malloc arenas, which hub and spoke daemons both limit before their threads start.

glibc gives each thread that allocates its own arena (up to 8 per core) and does not reuse
memory freed in one arena in another, so each flood of connections that gRPC core's
threads served left a daemon larger than the last. With :data:`MALLOC_ARENAS` arenas
(``mallopt(M_ARENA_MAX)``, glibc's ``glibc.malloc.arena_max`` tunable; mallopt(3)) the
same floods level off after the first.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools

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
    libc = _glibc()
    if libc is None:
        return False
    mallopt = libc.mallopt
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_ARENA_MAX, arenas))


TRIM_EVERY_S = 10.0
"""How often a hub or spoke daemon gives freed heap pages back to the kernel, seconds
(:func:`trim_malloc`, from a worker thread)."""


def trim_malloc() -> bool:
    """Give the heap's free pages back to the kernel (``malloc_trim(0)``, malloc_trim(3)).

    glibc returns freed memory at the top of a heap by itself, but not pages freed in the
    middle of one (or of another arena), so after a flood of calls whose buffers were
    interleaved with memory still in use a daemon kept hundreds of MiB it no longer used;
    ``malloc_trim(0)`` walks every arena and releases each free page (glibc 2.8 or later).
    It takes each arena's lock in turn: call it from a worker thread, every few seconds.

    Returns:
        True when memory was released; False when none was, or where the C library is not
        glibc.
    """
    libc = _glibc()
    if libc is None:
        return False
    trim = libc.malloc_trim
    trim.argtypes = (ctypes.c_size_t,)
    trim.restype = ctypes.c_int
    return bool(trim(0))


async def trim_forever(every_s: float = TRIM_EVERY_S) -> None:
    """Gives freed heap pages back every ``every_s`` seconds (:func:`trim_malloc` in a
    worker thread), until cancelled: what a flood of calls left freed is returned within
    seconds of its end. A daemon runs it as a task beside its server."""
    while True:
        await asyncio.sleep(every_s)
        await asyncio.to_thread(trim_malloc)


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc (only glibc has ``gnu_get_libc_version``; musl's
    ``mallopt`` is a no-op and it has no ``malloc_trim``), else None."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.gnu_get_libc_version  # noqa: B018
        libc.malloc_trim  # noqa: B018
    except (OSError, AttributeError, TypeError):
        return None
    return libc
