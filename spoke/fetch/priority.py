"""The request classes every fetch has (:class:`Priority`), most urgent first, and who
asks for a block ahead of its readers (:class:`Source`).

A small module of its own: the scheduler queues by class, a source may use it (the mesh
tells a peer the class of a batch), and the services name both when they ask; none of
them needs the scheduler for it, and a block's life (:mod:`spoke.fetch.life`) and the
prefetch ledger (:mod:`spoke.fetch.ledger`) share them without importing each other.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum


class Priority(IntEnum):
    """Request classes; a lower value is served first."""

    DEMAND = 0
    PEER = 1
    HINT = 2
    READAHEAD = 3
    PREWARM = 4
    FILL = 5

    @property
    def label(self) -> str:
        """The metric label (``demand``, ``hint``, …)."""
        return self.name.lower()


SPECULATIVE = frozenset({Priority.HINT, Priority.READAHEAD})
"""Classes bounded by the prefetch budget."""


class Source(StrEnum):
    """Who asked for a block before any reader did (the ``source`` metric label)."""

    HINT = "hint"  # a read-order hint stream (spoke.prefetch.hints)
    READAHEAD = "readahead"  # the mount's in-file readahead (fusemount/readahead.py)
    CROSSFILE = "crossfile"  # the mount's cross-file readahead (fusemount/crossfile.py)
    FILL = "fill"  # background fill (spoke.prefetch.fill)
