"""SIEVE eviction, byte-weighted.

Zhang, Yang, Yue, Vigfusson and Rashmi, "SIEVE is Simpler than LRU: an Efficient
Turn-Key Eviction Algorithm for Web Caches", NSDI 2024 (Algorithm 1).

One FIFO queue, newest at the head, plus one "visited" bit per key and a *hand*. A hit
only sets the key's bit (no list surgery, which is why SIEVE's hits need no lock). To
evict, the hand walks from where it stopped last (at first: the tail, the oldest key)
towards the head, clearing set bits as it passes; the first key whose bit is clear is the
victim and the hand stays at the next newer key. At the head it wraps to the tail. New
keys go to the head with the bit clear. Unlike FIFO-reinsertion (CLOCK) the survivors are
not moved, so new keys sit between old survivors and the hand and are judged quickly
("lazy promotion, quick demotion").

Byte weighting: the cache calls :meth:`~spoke.cache.policy.EvictionPolicy.pop_victim` until
it is within capacity, so a block larger than the free room evicts as many keys as its
bytes need; the order is the paper's.
"""

from __future__ import annotations

from spoke.cache.policy import ByteWeightedPolicy


class _Node:
    """One key in the queue: its neighbours and its visited bit."""

    __slots__ = ("key", "newer", "older", "visited")

    def __init__(self, key: str) -> None:
        self.key = key
        self.newer: _Node | None = None  # towards the head
        self.older: _Node | None = None  # towards the tail
        self.visited = False


class SIEVEPolicy(ByteWeightedPolicy):
    """SIEVE (Zhang et al., NSDI 2024), byte-weighted.

    Keys in ``skip`` (see :meth:`pop_victim`) are passed over with their bit untouched:
    the hand neither clears nor evicts them.

    Attributes:
        hand: the key the next eviction starts from (None: start at the tail).
    """

    name = "sieve"

    def __init__(self, capacity_bytes: int) -> None:
        super().__init__(capacity_bytes)
        self._nodes: dict[str, _Node] = {}
        self._head: _Node | None = None  # newest
        self._tail: _Node | None = None  # oldest
        self._hand: _Node | None = None

    @property
    def hand(self) -> str | None:
        """The key the next eviction looks at first (None: the tail)."""
        return self._hand.key if self._hand is not None else None

    def visited(self, key: str) -> bool:
        """The visited bit of resident ``key`` (False when not resident)."""
        node = self._nodes.get(key)
        return node is not None and node.visited

    def _admit(self, key: str, size: int) -> None:
        """Insert at the head, bit clear."""
        node = _Node(key)
        node.older = self._head
        if self._head is not None:
            self._head.newer = node
        self._head = node
        if self._tail is None:
            self._tail = node
        self._nodes[key] = node

    def _hit(self, key: str) -> None:
        """A hit sets the visited bit; nothing moves."""
        self._nodes[key].visited = True

    def _discard(self, key: str) -> None:
        node = self._nodes.pop(key, None)
        if node is not None:
            self._unlink(node)

    def _evict(self, skip: set[str]) -> str | None:
        """Move the hand to the first unvisited key (clearing bits on the way) and evict it."""
        node = self._hand or self._tail
        # one lap clears every bit outside skip, so two laps find a victim if there is one
        for _ in range(2 * len(self._nodes) + 1):
            if node is None:
                return None
            if node.key in skip:
                pass
            elif node.visited:
                node.visited = False
            else:
                self._hand = node
                del self._nodes[node.key]
                self._unlink(node)  # the hand moves on to the next newer key
                return node.key
            node = node.newer or self._tail
        return None

    def _unlink(self, node: _Node) -> None:
        if self._hand is node:
            self._hand = node.newer  # None at the head: the next eviction wraps to the tail
        if node.newer is not None:
            node.newer.older = node.older
        else:
            self._head = node.older
        if node.older is not None:
            node.older.newer = node.newer
        else:
            self._tail = node.newer
        node.newer = node.older = None

    def _walk(self) -> list[_Node]:
        out: list[_Node] = []
        node = self._tail
        while node is not None:
            out.append(node)
            node = node.newer
        return out

    def _ranked(self) -> list[str]:
        """Queued keys in the hand's order: from the hand to the head, then from the tail
        up to the hand, unvisited keys before visited ones (the order a full sweep would
        evict them in, ignoring later hits)."""
        queue = self._walk()
        start = queue.index(self._hand) if self._hand is not None else 0
        lap = queue[start:] + queue[:start]
        return [n.key for n in lap if not n.visited] + [n.key for n in lap if n.visited]

    def check_invariants(self) -> None:
        """The queue links both ways and holds exactly the resident keys; the hand is in it."""
        super().check_invariants()
        queue = self._walk()
        assert [n.key for n in queue] == [n.key for n in reversed(self._reverse())], "links"
        assert {n.key for n in queue} == self._ranked_keys, "queue != ranked keys"
        assert len(queue) == len(self._nodes), "a key is in the queue twice"
        assert all(self._nodes[n.key] is n for n in queue), "node table out of sync"
        assert self._hand is None or self._hand in queue, "the hand is off the queue"

    def _reverse(self) -> list[_Node]:
        out: list[_Node] = []
        node = self._head
        while node is not None:
            out.append(node)
            node = node.older
        return out
