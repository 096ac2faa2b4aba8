"""Which open connection a newcomer displaces when a small HTTP server is at its connection
cap: max-min fair shares of the slots by the client's address, then the one owing longest.

The spoke's admin and ``--metrics`` ports (:mod:`spoke.serve.adminserver`) and the hub's
metrics port (:mod:`hub.serve.metricsendpoint`) each serve at most a few dozen connections.
Displacing the connection that has owed something longest (a request not yet sent, answers
not yet taken) keeps slow senders and readers out, but a client opening connections faster
than the cap over :data:`~spoke.serve.adminserver.DISPLACE_AFTER_S` keeps every slot
younger than that and every newcomer out, the kubelet's probe included (the thirteenth
probe: 1,200 silent connections a second from one address). So a newcomer first takes the
slot of an address holding at least two more connections than its own (the one holding
most, its connection owing longest), whatever that connection's age: one address cannot
keep another out, however fast it opens. A newcomer whose address holds none needs only an
address holding one: spread over as many addresses as there are slots, a flood held one
each and kept a fresh address out (the probe's 64 addresses: 16 of 30 probes); now it only
displaces its own kind, the newest connection (the kubelet's, owing its request for a
millisecond) last. Among addresses within one of each other otherwise, the old rule stands:
the one owing longest, once it has owed ``after_s``.

Both servers keep the client's address beside each connection; the kubelet probes from the
node's address and Prometheus from its own pod's, neither shared with a tenant's pod.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


def victim(
    newcomer: K,
    owing: Iterable[tuple[K, float, T]],
    held: Mapping[K, int],
    now: float,
    after_s: float,
) -> T | None:
    """The connection a newcomer at the cap displaces, or None (the newcomer is refused).

    Args:
        newcomer: The arriving client's address (a host; the port is left out).
        owing: The open connections that owe something, each as (client address, owing
            since (monotonic seconds), connection); connections being served are left out.
        held: Open connections by client address, all of them (owing or being served).
        now: The time, monotonic seconds.
        after_s: Least time a connection must have owed, seconds, before a newcomer from an
            address holding as many connections (or one fewer) may displace it.

    Returns:
        From the address holding the most connections, at least two more than the
        newcomer's (at least one, when the newcomer's holds none), its connection owing
        longest; else the connection owing longest over all, if it has owed at least
        ``after_s``; else None.
    """
    mine = held.get(newcomer, 0)
    least = mine + 2 if mine else 1  # what an address must hold to give up a slot to it
    over: tuple[int, float, T] | None = None  # (-held, since, conn): the least wins
    aged: tuple[float, T] | None = None
    for address, since, conn in owing:
        count = held.get(address, 0)
        if count >= least and (over is None or (-count, since) < over[:2]):
            over = (-count, since, conn)
        if now - since >= after_s and (aged is None or since < aged[0]):
            aged = (since, conn)
    if over is not None:
        return over[2]
    return None if aged is None else aged[1]


INSPECT = 8
"""Most connections :meth:`Ledger.victim` asks what they owe, for one newcomer: the
choice stays constant time an arrival (a scan of every open connection, each asked, made a
flood of 1,200 connections a second take a daemon's whole core: the fourteenth probe)."""


class Holders(Generic[T]):
    """Connections by address, each address's in arrival order, and the addresses by how
    many they hold (each count's in the order they reached it): the address holding most
    and its oldest connection in constant time. :class:`Ledger` keeps one of all its
    connections; :class:`strata_local.doorslots.DoorSlots` one of those not proven and one
    of those proven.

    Not thread-safe: one event loop owns it.
    """

    def __init__(self) -> None:
        self.by_host: dict[str, dict[T, None]] = {}
        self._by_count: dict[int, dict[str, None]] = {}
        self.most = 0  # what the address holding most holds

    def held(self, host: str) -> int:
        """How many connections ``host`` holds."""
        return len(self.by_host.get(host, ()))

    def holding(self, count: int) -> Iterable[str]:
        """The addresses holding ``count`` connections, in the order they reached it."""
        return self._by_count.get(count, ())

    def oldest_of_most(self) -> T | None:
        """The oldest connection of the address holding most (the first to get there)."""
        if not self.most:
            return None
        host = next(iter(self._by_count[self.most]))
        return next(iter(self.by_host[host]))

    def add(self, host: str, conn: T) -> None:
        """Counts ``conn`` for ``host`` (not already counted)."""
        held = self.by_host.setdefault(host, {})
        self._move(host, len(held), len(held) + 1)
        held[conn] = None

    def touch(self, host: str, conn: T) -> None:
        """Moves ``conn`` of ``host`` (counted) behind the others: newest, as if it came
        now (a connection just used is the last of its address to give way)."""
        held = self.by_host[host]
        del held[conn]
        held[conn] = None

    def remove(self, host: str, conn: T) -> None:
        """Forgets ``conn`` of ``host`` (counted)."""
        held = self.by_host[host]
        del held[conn]
        self._move(host, len(held) + 1, len(held))
        if not held:
            del self.by_host[host]

    def _move(self, host: str, before: int, after: int) -> None:
        """Moves ``host`` from the bucket of ``before`` connections to ``after``'s."""
        if before:
            bucket = self._by_count[before]
            del bucket[host]
            if not bucket:
                del self._by_count[before]
        if after:
            self._by_count.setdefault(after, {})[host] = None
        self.most = max(self.most, after)
        while self.most and self.most not in self._by_count:
            self.most -= 1


class Ledger(Generic[T]):
    """The open connections of one server, kept so that :meth:`victim` applies
    :func:`victim`'s rule in constant time: held counts by address, kept as they change;
    each address's connections in arrival order; addresses by how many they hold
    (:class:`Holders`).

    Where :func:`victim` takes the connection owing longest, this takes, of the first
    :data:`INSPECT` connections in arrival order (of the address chosen, or of all), the
    one owing longest: the same one whenever the oldest connections are the ones owing
    longest, as a flood's are.

    Not thread-safe: one event loop owns it.
    """

    def __init__(self) -> None:
        self._holders: Holders[T] = Holders()
        self._all: dict[T, str] = {}  # every connection, in arrival order: its address

    def __len__(self) -> int:
        return len(self._all)

    @property
    def held(self) -> dict[str, int]:
        """Open connections by address."""
        return {host: len(conns) for host, conns in self._holders.by_host.items()}

    def add(self, address: str, conn: T) -> None:
        """Counts ``conn``, opened from ``address``."""
        if conn in self._all:
            return
        self._all[conn] = address
        self._holders.add(address, conn)

    def remove(self, conn: T) -> None:
        """Forgets ``conn`` (it ended or was displaced). Idempotent."""
        address = self._all.pop(conn, None)
        if address is not None:
            self._holders.remove(address, conn)

    def victim(
        self,
        newcomer: str,
        owing_since: Callable[[T], float | None],
        now: float,
        after_s: float,
    ) -> T | None:
        """The connection a newcomer from ``newcomer`` displaces, or None (see
        :func:`victim`; ``owing_since`` asks a connection since when it has owed something,
        None when it owes nothing)."""
        holders = self._holders
        mine = holders.held(newcomer)
        least = mine + 2 if mine else 1
        asked = 0
        for count in range(holders.most, least - 1, -1):
            best: tuple[float, T] | None = None  # of the addresses holding ``count``
            for address in holders.holding(count):
                chosen, n = _longest(holders.by_host[address], owing_since, INSPECT - asked)
                asked += n
                if chosen is not None and (best is None or chosen[0] < best[0]):
                    best = chosen
                if asked >= INSPECT:
                    break
            if best is not None:
                return best[1]
            if asked >= INSPECT:
                break
        chosen, _ = _longest(self._all, owing_since, INSPECT)
        if chosen is not None and now - chosen[0] >= after_s:
            return chosen[1]
        return None


def _longest(
    conns: Iterable[T], owing_since: Callable[[T], float | None], most: int
) -> tuple[tuple[float, T] | None, int]:
    """Of the first ``most`` of ``conns``, the one owing longest as (since, conn), or None;
    and how many were asked."""
    best: tuple[float, T] | None = None
    asked = 0
    for conn in conns:
        if asked >= most:
            break
        asked += 1
        since = owing_since(conn)
        if since is not None and (best is None or since < best[0]):
            best = (since, conn)
    return best, asked
