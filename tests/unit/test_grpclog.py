"""gRPC's report of a write to a stream its client cancelled is one INFO line
(strata_local.grpclog); other records of gRPC's logger pass unchanged."""

from __future__ import annotations

import logging
import sys

from strata_local.grpclog import GRPC_LOGGER, EndedByClient


class ExecuteBatchError(Exception):
    """Named as grpc.aio's (grpc._cython.cygrpc.ExecuteBatchError)."""


def _record(error: Exception, message: str) -> logging.LogRecord:
    try:
        raise error
    except Exception:
        exc_info = sys.exc_info()
    return logging.LogRecord(GRPC_LOGGER, logging.ERROR, __file__, 1, message, (), exc_info)


def test_a_failed_write_to_a_cancelled_stream_is_one_info_line() -> None:
    record = _record(
        ExecuteBatchError('Failed "execute_batch"'),
        "ExecuteBatchError raised in core by servicer method [/protocol.hub.v1.Hub/ReadBlocks]",
    )
    assert EndedByClient().filter(record)
    assert record.levelno == logging.INFO and record.exc_info is None
    line = logging.Formatter().format(record)
    assert line == (
        "a stream ended by its client while a reply was being sent: /protocol.hub.v1.Hub/ReadBlocks"
    )


def test_other_errors_keep_their_traceback() -> None:
    record = _record(ValueError("a real fault"), "Unexpected error in servicer")
    assert EndedByClient().filter(record)
    assert record.levelno == logging.ERROR and record.exc_info is not None
    assert "Traceback" in logging.Formatter().format(record)
