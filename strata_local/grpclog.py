"""gRPC's own log records, as they reach the hub's and the spoke's logs.

When a client cancels a stream (a spoke stops reading, a reader's deadline passes) while
the hub (or a spoke's peer port) is writing a reply to it, grpc.aio logs the failed write
(``ExecuteBatchError raised in core by servicer method [...]``) with a full traceback, at
ERROR, from ``grpc._cython.cygrpc``: a dozen lines for an ordinary event, and an operator
scanning for errors sees a fault where there is none. :class:`EndedByClient` turns each
such record into one INFO line naming the method; any other record of that logger passes
unchanged.
"""

from __future__ import annotations

import logging
import re

GRPC_LOGGER = "grpc._cython.cygrpc"
"""The logger grpc.aio's server reports exceptions of servicer methods to."""

_FAILED_WRITE = "ExecuteBatchError"

_METHOD = re.compile(r"\[(/[^\]]*)\]")
"""The method in grpc.aio's message (``... servicer method [/package.Service/Method]``)."""


class EndedByClient(logging.Filter):
    """Rewrites grpc.aio's report of a write to a call its client already ended as one
    INFO line without a traceback (:func:`install`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if error is None or type(error).__name__ != _FAILED_WRITE:
            return True
        method = _METHOD.search(record.getMessage())
        record.msg = "a stream ended by its client while a reply was being sent: %s"
        record.args = (method[1] if method else "a method",)
        record.exc_info = None
        record.exc_text = None
        record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def install() -> None:
    """Adds :class:`EndedByClient` to gRPC's logger, once per process."""
    logger = logging.getLogger(GRPC_LOGGER)
    if not any(isinstance(f, EndedByClient) for f in logger.filters):
        logger.addFilter(EndedByClient())
