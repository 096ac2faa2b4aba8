"""What a block's life is (:mod:`spoke.fetch.life` moves them): its states
(:class:`State`), the events its subscribers hear (:class:`Event`), the transitions each
state allows (:data:`NEXT`, :data:`IN_FLIGHT`, :class:`InvalidTransition`) and the
:class:`Life` record with everything that depends on its state, placement included.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from enum import Enum, auto
from typing import TYPE_CHECKING

from spoke.cache.admission import Placement
from spoke.fetch.priority import Priority, Source

if TYPE_CHECKING:
    from spoke.fetch.pacer import Stream


class State(Enum):
    """Where a block's life is."""

    WANTED = auto()  # waiting in its class's queue
    WIRE = auto()  # asked of the source, not arrived
    VERIFIED = auto()  # arrived and verified; its admission (disk write) runs
    LEFT = auto()  # its batch ended (cancelled) before it arrived
    RESIDENT = auto()  # in the cache, placed ahead of any reader and not read yet
    STREAMED = auto()  # handed to its readers uncached (the cache could not take it)
    FAILED = auto()  # the fetch gave up, or the spoke closed
    EVICTED = auto()  # left the cache before anyone read it
    DONE = auto()  # out of the machine: resident and read (or a reader's from the start)


class Event(Enum):
    """What subscribers hear: a life's transition (the name is what happened)."""

    WANTED = auto()  # a new life, queued
    CLAIMED = auto()  # a reader took over a prefetch still queued (the guess was right)
    SENT = auto()  # its batch left
    ARRIVED = auto()  # WIRE -> VERIFIED
    LEFT = auto()  # WIRE -> LEFT
    RESIDENT = auto()  # admitted: read (``life.read``) or kept until read / evicted
    STREAMED = auto()  # not kept: its readers had its bytes
    FAILED = auto()  # its readers had the error
    READ = auto()  # a resident prefetch's first read
    EVICTED = auto()  # a resident prefetch evicted unread


IN_FLIGHT = frozenset({State.WANTED, State.WIRE, State.VERIFIED, State.LEFT})
NEXT: dict[State, frozenset[State]] = {
    State.WANTED: frozenset({State.WIRE, State.FAILED}),
    State.WIRE: frozenset({State.VERIFIED, State.LEFT, State.FAILED}),
    State.VERIFIED: frozenset({State.RESIDENT, State.DONE, State.STREAMED, State.FAILED}),
    State.LEFT: frozenset({State.FAILED}),
    State.RESIDENT: frozenset({State.DONE, State.EVICTED}),
}
"""The transitions a life may make, from each state that has any."""


class InvalidTransition(RuntimeError):
    """A life was asked to move where its state allows no move: a bug, never input."""


@dataclass(eq=False)
class Life:
    """One block's life: its state and everything that depends on it.

    Attributes:
        digest, size: the block (bytes).
        priority: its class now (raised by a more urgent request while queued).
        future: what its readers wait for: None (resident), its bytes (streamed through)
            or the error.
        state: where it is (:class:`State`).
        sent_as: the class its batch left in.
        source: who asked for it ahead of any reader (the ledger's), or None.
        claimed: a reader took the fetch over while it was queued: ``source``'s no more.
        read: a reader read it, or waits for it.
        unseen: read while its admission ran, which the policy could not record then.
        placed: how the cache admits it, chosen at admission (:meth:`placement`).
        stream: the stream it left on.
        tenant: whose datasets hold it (with tenants' shares, :mod:`spoke.cache.tenants`).
    """

    digest: str
    size: int
    priority: Priority
    future: asyncio.Future[bytes | None]
    state: State = State.WANTED
    sent_as: Priority | None = None
    source: Source | None = None
    claimed: bool = False
    read: bool = False
    unseen: bool = False
    placed: Placement | None = None
    stream: Stream | None = None
    tenant: str | None = None

    @property
    def prefetch(self) -> Source | None:
        """The prefetch source this life counts for in the ledger (None: a reader's)."""
        return None if self.claimed else self.source

    def placement(self) -> Placement:
        """How the cache admits it, chosen once: ahead of readers while only its prefetch
        source asked (a hint's at the hinted end, readahead's and fill's into free room),
        as a reader's otherwise."""
        if self.placed is None:
            source = self.prefetch
            if source is None or self.read:
                self.placed = Placement.DEMAND
            else:
                self.placed = Placement.HINTED if source is Source.HINT else Placement.AHEAD
        return self.placed
