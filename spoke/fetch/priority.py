"""The request classes every fetch has (:class:`Priority`), most urgent first.

A small module of its own: the scheduler queues by class, a source may use it (the mesh
tells a peer the class of a batch), and the services name it when they ask; none of them
needs the scheduler for it.
"""

from __future__ import annotations

from enum import IntEnum


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
