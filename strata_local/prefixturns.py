"""Turns taken round the networks a caller's address belongs to, widest first, so that a
flood from one network has one turn in a round of the networks that wait, however many of
its addresses it uses.

An IPv6 host is routed a /64 and a customer a /48 (RFC 6177), so a flood from one host
can come from as many addresses as it sends connections, and one from one customer from
as many /64s; an IPv4 address is scarcer, but a /24 is the least a provider routes. Taken
in turns by address alone, such a flood is as many callers as it has connections, and a
new caller's handshake had about the rate's fraction of the arrivals' chance (issue 39's
thirty-fourth probe: 21 of 35 tries of new spokes under 4,000 whole ClientHellos a
second). Taken round a tree of prefixes — IPv4 /16, /24, the address; IPv6 /32, /48, /64,
the address — a caller from a network the flood does not use is among the first of the
next round: one turn in a round at each level, the newest network or address first.

Turns by prefix alone would hand a fresh fleet in one network (the nodes of one cluster)
one turn a round against a flood spread over many networks, less than it had by address;
:class:`strata_local.handshakes.HandshakeTurns` therefore gives every other turn of the
callers it does not know by address (:class:`AlternateTurns`), so no one has less than
half the turns it had by address; and inside the turn of those who proved one token,
round their networks and by address in turn.

Every operation is constant time (the trees are at most five levels deep).
"""

from __future__ import annotations

import collections
import socket
from collections.abc import Hashable
from typing import Generic, TypeVar

T = TypeVar("T", bound=Hashable)
Key = str | bytes
"""A key of a tree's level: a network's leading bytes, an address, or a name."""

PREFIXES_V4 = (16, 24)
"""The IPv4 networks an address is taken in, widest first (then the address itself)."""

PREFIXES_V6 = (32, 48, 64)
"""The IPv6 networks an address is taken in, widest first (then the address itself)."""


def network_path(host: str) -> tuple[Key, ...]:
    """The networks ``host`` belongs to, widest first, then ``host`` itself.

    Args:
        host: An address as :func:`strata_local.doorway.caller_address` gives it
            (``10.0.0.7``, ``2001:db8::7``, ``fe80::1%eth0``); anything that is not an IP
            address stands alone.

    Returns:
        For IPv4 the address's first 2 and 3 bytes (its /16 and /24) and ``host``; for
        IPv6 its first 4, 6 and 8 bytes (/32, /48, /64) and ``host``; else ``(host,)``.
        (Bytes, not names: :func:`socket.inet_pton` takes 0.3 µs where
        :func:`ipaddress.ip_network` took 12 µs an IPv4 path and 39 µs an IPv6 one, for
        each waiting connection of a flood.)
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        packed = socket.inet_pton(family, host.partition("%")[0])
    except OSError:
        return (host,)
    cuts = PREFIXES_V4 if family == socket.AF_INET else PREFIXES_V6
    return (*(packed[: bits // 8] for bits in cuts), host)


class PrefixTurns(Generic[T]):
    """Items waiting for their turn, in a tree of keys, taken round robin at every level:
    the first key of each level (the newest to join, or the next of a round), then that
    key's oldest item; each key that had a turn goes behind its siblings.

    The paths given for one tree must be prefix-free (no path a proper prefix of
    another): a path's last key holds items, the others hold keys. Not thread-safe.
    """

    def __init__(self) -> None:
        self._root = collections.OrderedDict[Key, object]()
        self._path: dict[T, tuple[Key, ...]] = {}

    def __len__(self) -> int:
        return len(self._path)

    def __contains__(self, item: object) -> bool:
        return item in self._path

    def add(self, path: tuple[Key, ...], item: T) -> None:
        """``item`` waits under ``path`` (widest key first), behind that key's others; a
        key new to its level goes first in it.

        Raises:
            ValueError: ``path`` is empty, or ``item`` already waits.
        """
        if not path or item in self._path:
            raise ValueError(f"cannot add {item!r} under {path!r}")
        node: collections.OrderedDict[Key, object] = self._root
        for depth, key in enumerate(path):
            child = node.get(key)
            if child is None:
                last = depth == len(path) - 1
                child = node[key] = {} if last else collections.OrderedDict()
                node.move_to_end(key, last=False)  # the newest first
            node = child  # type: ignore[assignment]
        node[item] = None  # type: ignore[index]
        self._path[item] = path

    def take(self) -> T:
        """The item whose turn is now; it no longer waits.

        Raises:
            LookupError: nothing waits.
        """
        if not self._path:
            raise LookupError("nothing waits")
        chain: list[tuple[collections.OrderedDict[Key, object], Key]] = []
        node: object = self._root
        while isinstance(node, collections.OrderedDict):
            key = next(iter(node))
            chain.append((node, key))
            node = node[key]
        assert isinstance(node, dict)
        item: T = next(iter(node))
        del node[item], self._path[item]
        self._leave(chain, turn=True)
        return item

    def remove(self, item: T, turn: bool = False) -> bool:
        """``item`` no longer waits. Idempotent.

        Args:
            item: What waits.
            turn: Whether it had its turn elsewhere (another tree of the same items):
                the keys on its path go behind their siblings, as :meth:`take` moves
                them; else no key's place changes.

        Returns:
            Whether it was waiting.
        """
        path = self._path.pop(item, None)
        if path is None:
            return False
        chain: list[tuple[collections.OrderedDict[Key, object], Key]] = []
        node: object = self._root
        for key in path:
            assert isinstance(node, collections.OrderedDict)
            chain.append((node, key))
            node = node[key]
        assert isinstance(node, dict)
        del node[item]
        self._leave(chain, turn)
        return True

    @staticmethod
    def _leave(chain: list[tuple[collections.OrderedDict[Key, object], Key]], turn: bool) -> None:
        """Drops the keys on ``chain`` (root first) left empty; with ``turn``, the others
        go behind their siblings."""
        for parent, key in reversed(chain):
            if not parent[key]:
                del parent[key]
            elif turn:
                parent.move_to_end(key)  # had its turn: behind the others
            else:
                return


class AlternateTurns(Generic[T]):
    """The same items in two :class:`PrefixTurns` trees, taken from each in turn (the
    first tree first): an item taken from one leaves the other as though it had its turn
    there too. Not thread-safe."""

    def __init__(self) -> None:
        self._trees = (PrefixTurns[T](), PrefixTurns[T]())
        self._turn = 0

    def __len__(self) -> int:
        return len(self._trees[0])

    def add(self, first: tuple[Key, ...], second: tuple[Key, ...], item: T) -> None:
        """``item`` waits under ``first`` in the first tree and ``second`` in the other.

        Raises:
            ValueError: a path is empty, or ``item`` already waits.
        """
        self._trees[0].add(first, item)
        try:
            self._trees[1].add(second, item)
        except ValueError:
            self._trees[0].remove(item)
            raise

    def take(self) -> T:
        """The item whose turn is now, from each tree in turn; it no longer waits.

        Raises:
            LookupError: nothing waits.
        """
        tree, other = self._trees if self._turn % 2 == 0 else self._trees[::-1]
        item = tree.take()
        other.remove(item, turn=True)
        self._turn += 1
        return item

    def remove(self, item: T) -> bool:
        """``item`` no longer waits (no key's place changes). Idempotent.

        Returns:
            Whether it was waiting.
        """
        return self._trees[0].remove(item) and self._trees[1].remove(item)
