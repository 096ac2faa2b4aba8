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

from collections.abc import Hashable, Iterable, Mapping
from typing import TypeVar

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
