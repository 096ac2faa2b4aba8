"""The mount's one error boundary: every FUSE handler's exceptions become an errno here.

Known errors map to their errno; anything unexpected is logged, counted and returned as
EIO. Nothing escapes to pyfuse3 except ``FUSEError``, so no bug can crash the mount.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
from collections import Counter
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import grpc
import pyfuse3

from fusemount.readerrors import READ_HANDLERS, count_read_error
from fusemount.source import BlockUnavailableError

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

#: unexpected errors per handler name, for tests and the mount's own stats
UNEXPECTED_ERRORS: Counter[str] = Counter()

#: fault injection for tests: a file naming handlers (whitespace-separated) that must raise
FAULT_FILE_ENV = "STRATA_MOUNT_FAULT_FILE"
_FAULT_FILE = os.environ.get(FAULT_FILE_ENV)


class InjectedFault(RuntimeError):
    """Raised inside a handler named in ``$STRATA_MOUNT_FAULT_FILE`` (tests only)."""


def _inject(name: str) -> None:
    if _FAULT_FILE is None:
        return
    try:
        wanted = Path(_FAULT_FILE).read_text(encoding="utf-8").split()
    except OSError:
        return
    if name in wanted:
        raise InjectedFault(f"injected fault in {name}")


_GRPC_ERRNO = {
    grpc.StatusCode.NOT_FOUND: errno.ENOENT,
    grpc.StatusCode.INVALID_ARGUMENT: errno.EINVAL,
    grpc.StatusCode.PERMISSION_DENIED: errno.EACCES,
    grpc.StatusCode.UNAUTHENTICATED: errno.EACCES,
}


def errno_for(exc: BaseException) -> int | None:
    """The errno a known domain error maps to; None when the error is unexpected."""
    if isinstance(exc, BlockUnavailableError):
        return exc.errno or errno.EIO
    if isinstance(exc, grpc.RpcError):
        code = exc.code() if hasattr(exc, "code") else None
        return _GRPC_ERRNO.get(code, errno.EIO)  # type: ignore[arg-type]
    if isinstance(exc, FileNotFoundError):
        return errno.ENOENT
    if isinstance(exc, TimeoutError):
        return errno.EIO
    return None


def boundary(fn: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Coroutine[Any, Any, T]]:
    """Wrap an ``Operations`` handler so it only ever raises ``pyfuse3.FUSEError``."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            if _FAULT_FILE is not None:
                _inject(fn.__name__)
            return await fn(*args, **kwargs)
        except pyfuse3.FUSEError as err:
            if err.errno == errno.EIO and fn.__name__ in READ_HANDLERS:
                count_read_error()
            raise
        except Exception as exc:
            code = errno_for(exc)
            if code is None:
                UNEXPECTED_ERRORS[fn.__name__] += 1
                log.exception("unexpected error in %s; returning EIO", fn.__name__)
                code = errno.EIO
            else:
                log.warning("%s failed: %s (errno %d)", fn.__name__, _describe(exc), code)
            if code == errno.EIO and fn.__name__ in READ_HANDLERS:
                count_read_error()
            raise pyfuse3.FUSEError(code) from exc

    return wrapper


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.RpcError) and hasattr(exc, "details"):
        details: Any = exc.details()
        return f"{exc.code().name}: {details}"  # type: ignore[attr-defined]
    return f"{type(exc).__name__}: {exc}"
