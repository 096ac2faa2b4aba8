"""The relay tree: how a block every spoke of the region wants at once leaves its owner
only :data:`RELAY_FANOUT` times.

When a whole region starts one job, every spoke misses the same first blocks at the same
second and asks the same owner for each: the owner would send each block ``N - 1`` times
from its one daemon process (``BENCHMARKS.md``, "Scale"). Instead, for each block the live
spokes are ordered by their rendezvous score for it (:func:`spoke.mesh.rendezvous.ranked`:
rank 0 is the owner) and form a tree of fan-out :data:`RELAY_FANOUT` over those ranks:
rank ``r > 0``'s relay is rank ``(r - 1) // RELAY_FANOUT`` (:func:`relay_rank`), so ranks
1..8 hang off the owner, 9..16 off rank 1, and so on (``ceil(log8(7N + 1))`` levels).

A spoke still asks the owner first: a block that is not hot (a spoke's own shard) takes one
hop. The owner answers a caller that follows relay hints (``PeerReadRequest.follows_relays``)
with the block's digest in ``strata-relay-bin`` instead of the block once it has been asked
for it by :data:`RELAY_FANOUT` other spokes within :data:`HOT_WINDOW_S` (:class:`HotBlocks`),
and the caller asks its relay (``PeerReadRequest.relay``), which serves the block from its
cache or gets it the same way, never from the hub (single flight at every spoke, so its
children's calls join its own fetch). A relay request is never answered with a hint.

No request can loop, whatever two spokes' views of the membership: a relay is always a spoke
with a higher rendezvous score for the block than the spoke asking it (scores do not depend
on the view), and the spoke that sees itself as the owner fetches from the hub.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from spoke.mesh.rendezvous import ranked

RELAY_FANOUT = 8
"""Spokes one spoke serves a hot block to: the owner's direct callers before a block is
hot, and each spoke's children in the relay tree."""

HOT_WINDOW_S = 30.0
"""How long the spokes that asked for a block are remembered by its owner, seconds (a job's
first batch arrives within a few seconds; after the window, a block is not hot again until
:data:`RELAY_FANOUT` spokes asked once more)."""

HOT_TRACKED = 4096
"""Most blocks an owner remembers askers of (least recently asked forgotten first): a job's
first batch is tens of blocks; a spoke's own shard is asked for by one spoke each."""

RELAY_METADATA = "strata-relay-bin"
"""Initial metadata key of the owner's relay hint: 16 raw bytes per digest it did not send
because the block is hot (the caller asks its relay); repeated in the trailers when the
call sends no block, as ``strata-declined-bin`` is."""


def relay_rank(rank: int, fanout: int = RELAY_FANOUT) -> int:
    """The rank of the relay of the spoke at ``rank`` (> 0) in the tree of ``fanout``.

    Raises:
        ValueError: ``rank`` is 0 (the owner has no relay) or negative.
    """
    if rank < 1:
        raise ValueError(f"rank {rank} has no relay")
    return (rank - 1) // fanout


def levels(nodes: int, fanout: int = RELAY_FANOUT) -> int:
    """Hops from the owner to the deepest of ``nodes`` spokes in the tree (0: only the
    owner)."""
    deepest, depth = nodes - 1, 0
    while deepest > 0:
        deepest = relay_rank(deepest, fanout)
        depth += 1
    return depth


def relay_of(digest: str, nodes: Sequence[str], me: str, fanout: int = RELAY_FANOUT) -> str | None:
    """The spoke ``me`` asks for a hot ``digest`` among the live ``nodes`` (``me``
    included): its parent in the tree, or None when ``me`` is the owner (the hub)."""
    order = ranked(digest, nodes)
    rank = order.index(me)
    return None if rank == 0 else order[relay_rank(rank, fanout)]


class HotBlocks:
    """Which blocks an owner has been asked for by :data:`RELAY_FANOUT` spokes lately.

    Args:
        fanout: askers after which a block is hot.
        window: how long an asker is remembered, seconds (from the block's first asker).
        tracked: most blocks remembered.
        now: the monotonic clock.
    """

    def __init__(
        self,
        fanout: int = RELAY_FANOUT,
        window: float = HOT_WINDOW_S,
        tracked: int = HOT_TRACKED,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.fanout = fanout
        self.window = window
        self.tracked = tracked
        self._now = now
        self._askers: OrderedDict[str, tuple[float, set[str]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._askers)

    def asked(self, digest: str, node: str) -> bool:
        """Record that ``node`` asks for ``digest``; True when the block is hot for it:
        :attr:`fanout` other spokes asked within the window (``node`` is then not
        recorded: it is sent to its relay). A spoke already recorded asking again (a
        retry) is never told the block is hot."""
        now = self._now()
        since, askers = self._askers.pop(digest, (now, set()))
        if now - since > self.window:
            since, askers = now, set()
        self._askers[digest] = (since, askers)  # most recently asked last
        while len(self._askers) > self.tracked:
            self._askers.popitem(last=False)
        if node in askers:
            return False
        if len(askers) >= self.fanout:
            return True
        askers.add(node)
        return False
