"""Reads and opens the mount answered with EIO, counted by the error boundary
(:mod:`fusemount.boundary`) and told to the daemon with the next hit report
(:mod:`fusemount.hits`): ``strata_spoke_read_errors_total``. Loop-only state, no imports,
so both may use it.
"""

from __future__ import annotations

READ_HANDLERS = frozenset({"read", "open"})
"""Handlers whose EIO a reader sees as a failed read."""

_untold = [0]  # reads answered with EIO not yet told to the daemon


def count_read_error() -> None:
    """A read or an open was answered with EIO."""
    _untold[0] += 1


def take_read_errors() -> int:
    """The reads and opens answered with EIO since the last call (counting starts again)."""
    taken, _untold[0] = _untold[0], 0
    return taken


def give_back_read_errors(count: int) -> None:
    """``count`` taken read errors were not told (the report failed): tell them next time."""
    _untold[0] += count
