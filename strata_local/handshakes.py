"""Whose handshake a port begins next: a rate of handshakes the machine can afford, taken
in turns round the caller's networks, addresses that proved a credential before first.

A whole TLS ClientHello costs its sender one small write, and the server a key exchange
and a certificate signature, plus the door's relay set-up (about 0.21 ms in gRPC core and
0.26 ms of Python a connection on this project's 2-core CI machine). So a flood of whole
ClientHellos — from one address or from two thousand — left the machine no CPU for the
callers it serves: issue 39's nineteenth probe and ``bench.door_flood --first hello``
measured 2 of 5 new peers answered at 4,000 a second, whether the flood came from one
address or 2,000. A doorway (:mod:`strata_local.doorway`) now begins at most
:attr:`HandshakeTurns.rate` handshakes a second (a token bucket, :data:`BURST_S` of them
at once), and a connection whose first message is whole while the bucket is empty waits,
still a bare socket in its slot, for its turn.

The rate is what the machine can afford, found much as TCP finds a path's (a cut on a
sign of load, once a round trip, and a gentler rise; RFC 5681, 3.1): every
:data:`PACE_S` the doorway tells :meth:`HandshakeTurns.pace` how late its event loop ran
a timer. Later than :data:`LATE_S` (:data:`LOOP_LATE_S` where the handshakes run on the
loop) twice in a row while handshakes began at ``least`` a second or more (one late
timer is a pause, not a load; a few handshakes are not what made it late), the rate
falls to :data:`BACK_OFF` of the rate they began at, at most once in :data:`HOLD_S` (as
TCP cuts once a round trip: the handshakes begun before the cut are still being done);
on time, it rises by :data:`SPEED_UP`; it stays between ``least`` and ``most``. A
machine that keeps up begins every handshake at once (a fixed 1,000 a second kept 13 of
19 new clients of a bulk port out at 2,400 ClientHellos a second, which that port served
all of before); one that falls behind begins what it can still finish. The turns:

- in turns round the caller's networks (:mod:`strata_local.prefixturns`: IPv4 /16,
  /24, the address; IPv6 /32, /48, /64, the address): each network with connections
  waiting has one begun before any has a second, at each level, and each address's
  oldest first, so a flood from one address, one host's /64 or one customer's /48, gets
  its turn and no more, and a caller from any other network is next (by address alone,
  a flood from one IPv6 host was as many callers as it sent connections: issue 39's
  older MEDIUM, 21 of 35 new spokes' tries answered under 4,000 whole ClientHellos a
  second); every other turn goes by address alone, so a fresh fleet in one network
  keeps at least half the turns it had by address against a flood spread over as many
  networks as connections;
- a network or address joining the turns goes to the front, one that had its turn to the
  back: when the waiting are spread over as many addresses as the flood has, the newest
  begin first, while their callers still wait, and the oldest are those the slots
  displace (taken in arrival order, they were displaced as their turn came:
  ``bench.door_flood --first hello``, 2,000 a second from 2,000 addresses, on a box with
  one of its 2 cores taken by another process, 3 of 23 new callers answered, against 8
  of 25 newest first); each arrival then has about the rate's fraction of the arrivals'
  chance, taken at random (a caller arriving just before a burst of the flood has less);
- addresses that proved a credential on this port within
  :data:`~strata_local.knownhosts.KNOWN_S`
  (:class:`KnownHosts`: a token or a client certificate a call carried) have their turns
  first, but for every :data:`UNKNOWN_EVERY`-th turn, which goes to the others while any
  wait, and they take them by who proved it, not by address (the token's subject; the
  region on a peer port): a fleet of spokes reconnecting keeps its handshakes under a
  flood from any number of new addresses, and a token holder flooding from the addresses
  it proved, however many, has one turn in a round of the known (the twenty-first probe:
  4,000 addresses proved in 10 s, a turn each, kept 14 of 22 returning spokes out) and
  cannot keep new callers out of theirs; one token holds at most
  :data:`~strata_local.knownhosts.SUBJECT_MOST` known addresses, and inside its turn
  its addresses go round their networks and by address (the newest first) in turn (as
  the unknown do), and the known go in ranks by the turns each address has had that its
  proofs did not pay for (:data:`SPENT_MOST`, :meth:`KnownHosts.spend`), the lowest
  first, so a
  flood from addresses a holder of the fleet's own token proved, which never proves
  again, falls behind the spokes that do, wherever its addresses are (the thirty-fourth
  probe's N2: 4,000 such addresses kept a restarted hub's fleet out until the flood
  ended, +31 s; the thirty-sixth probe's, the same from 200 /24s of the fleet's own /16,
  /64s of its /48 or addresses of its /64: +31 to +33 s; now +10 to +16 s). The slots
  (:mod:`strata_local.doorslots`) are not swayed by it: only the turns.

A flood spread over as many networks as it sends connections (as many IPv4 /16s, a
botnet's) is indistinguishable from as many new callers: beyond what the machine can
afford each new caller then gets about its fair fraction of the turns (the rest belongs
in front of the port: a firewall's rate limit of new connections). Every operation is
constant time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from strata_local.knownhosts import KnownHosts
from strata_local.prefixturns import AlternateTurns, network_path

T = TypeVar("T", bound=Hashable)

HANDSHAKE_RATE = 4000.0
"""Most handshakes a door begins a second, and its rate at first: beyond what one Python
thread relays (0.26 ms a connection), so the machine's lateness, not this, is the limit."""

LEAST_RATE = 100.0
"""Handshakes a door begins a second however late its machine runs."""

BURST_S = 0.1
"""Seconds of the rate a door may begin at once (the bucket's depth)."""

PACE_S = 0.1
"""How often the rate is reconsidered, seconds."""

LATE_S = 0.02
"""How late a timer of the event loop may run, seconds, before the rate falls, where the
handshakes are done elsewhere (gRPC core's threads, behind :mod:`strata_local.door`): the
loop's lateness is a late sign of their load. At 0.05 s ``bench.door_flood --first hello``
at 4,000 a second answered 5 of 7 returning peers (p50 1.9 s); at 0.02 s, 37 of 39."""

LOOP_LATE_S = 0.05
"""The same where the handshakes are done on the event loop itself
(:mod:`strata_local.streamdoor`'s TLS): its lateness is their own cost, which callers
bear. ``bench.handshake_flood --rate 2400``, new clients of a bulk port: at 0.02 s 17 of
21; at 0.05 s 32 of 32 once, then 9 of 11, 13 of 21 and 12 of 15 (the door before its
turns: 32 of 32); at 0.1 s 15 of 16 and 14 of 14, but at 4,000 a second a peak of 602 MiB
over rest."""

BACK_OFF = 0.7
"""The rate after a load made the loop late, as a fraction of the rate handshakes began at."""

HOLD_S = 0.5
"""Least time between two falls of the rate, seconds: the handshakes begun before one are
still being done after it, and the loop runs late a while yet."""

SPEED_UP = 1.1
"""The rate after a timer on time, as a multiple of the rate."""

UNKNOWN_EVERY = 4
"""While both known and other addresses wait, every ``UNKNOWN_EVERY``-th turn goes to the
others."""

SPENT_MOST = 2
"""Known addresses go in ``SPENT_MOST + 1`` ranks by the handshake turns they have had
that their connections' first proofs did not pay for (none, one, ``SPENT_MOST`` or more:
a flood's addresses climb them; a spoke proves on its first call, which pays for two,
:data:`~strata_local.knownhosts.PROOF_CREDIT`), the lowest rank first."""


class HandshakeTurns(Generic[T]):
    """Which waiting connection's handshake begins next (see the module).

    Args:
        most: Handshakes begun a second, at most (positive): the rate at first.
        known: The addresses whose turns come first.
        clock: Monotonic seconds.
        least: Handshakes begun a second however late the machine (at most ``most``).
        late_s: How late the loop may run before the rate falls (:data:`LATE_S`,
            :data:`LOOP_LATE_S`), seconds.

    Attributes:
        rate: Handshakes begun a second at most, now (:meth:`pace`).

    Raises:
        ValueError: ``most`` is not positive.

    Not thread-safe: one event loop owns it.
    """

    def __init__(
        self,
        most: float = HANDSHAKE_RATE,
        known: KnownHosts | None = None,
        clock: Callable[[], float] = time.monotonic,
        least: float = LEAST_RATE,
        late_s: float = LATE_S,
    ) -> None:
        if not most > 0:
            raise ValueError(f"the handshake rate must be positive, not {most}")
        self.most, self.least, self.late_s = most, min(least, most), late_s
        self.rate = most
        self.known = known if known is not None else KnownHosts(clock=clock)
        self._clock = clock
        self._tokens, self._at = self._burst(), clock()
        self._paced_at, self._begun_then = self._at, 0
        self._was_late = False
        self._hold_until = self._at
        # by turns spent unproven: in each, round who proved it, then its networks or addresses
        self._known = tuple(AlternateTurns[T]() for _ in range(SPENT_MOST + 1))
        self._host: dict[T, str] = {}  # a known one's address, to count its turn
        self._unknown = AlternateTurns[T]()  # round the networks, or by address
        self._turn = 0
        self.waiting = 0
        self.begun = 0
        self.waited = 0  # begun after waiting for a turn

    def offer(self, host: str, item: T) -> bool:
        """``item`` (a connection from ``host``) is ready for its handshake: True when it
        may begin now, else it waits for :meth:`due` (or :meth:`withdraw`)."""
        self._refill()
        if not self.waiting and self._tokens >= 1:
            self._tokens -= 1
            self.begun += 1
            self.known.spend(host)  # a turn too, if it is known
            return True
        standing = self.known.standing(host)
        if standing is None:
            self._unknown.add(network_path(host), (host,), item)
        else:  # a subject's one turn in a round; inside it, round its networks, or by address
            subject, spent = standing
            mine = f"proved by {subject}"
            self._known[min(spent, SPENT_MOST)].add((mine, *network_path(host)), (mine, host), item)
            self._host[item] = host
        self.waiting += 1
        return False

    def withdraw(self, item: T) -> None:
        """``item`` no longer waits (its connection ended). Idempotent."""
        if self._host.pop(item, None) is not None:
            for rank in self._known:
                if rank.remove(item):
                    break
            self.waiting -= 1
        elif self._unknown.remove(item):
            self.waiting -= 1

    def due(self) -> list[T]:
        """The waiting items whose turn is now (the bucket's tokens allowing), in order;
        they no longer wait."""
        self._refill()
        went: list[T] = []
        while self.waiting and self._tokens >= 1:
            self._turn += 1
            if self._host and (not self._unknown or self._turn % UNKNOWN_EVERY):
                item = next(rank for rank in self._known if rank).take()
                self.known.spend(self._host.pop(item))
            else:
                item = self._unknown.take()
            self.waiting -= 1
            self._tokens -= 1
            went.append(item)
        self.begun += len(went)
        self.waited += len(went)
        return went

    def wait_s(self) -> float | None:
        """Seconds until the next turn is due; None when nothing waits."""
        if not self.waiting:
            return None
        self._refill()
        return max(0.0, (1 - self._tokens) / self.rate)

    def pace(self, late_s: float) -> None:
        """Reconsiders :attr:`rate` (see the module), given how late the event loop ran
        the timer that calls this, seconds; every :data:`PACE_S`."""
        now = self._clock()
        elapsed, begun = now - self._paced_at, self.begun - self._begun_then
        late = late_s > self.late_s
        began = begun / elapsed if elapsed > 0 else 0.0
        if late and self._was_late and began >= self.least and now >= self._hold_until:
            self._hold_until = now + HOLD_S  # what was begun before the cut is still due
            self._refill()
            self.rate = max(self.least, min(self.rate, began) * BACK_OFF)
            self._tokens = min(self._tokens, self._burst())
        elif late_s <= self.late_s / 2:
            self.rate = min(self.most, self.rate * SPEED_UP)
        self._paced_at, self._begun_then = now, self.begun
        self._was_late = late

    def _burst(self) -> float:
        return max(1.0, self.rate * BURST_S)

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self._burst(), self._tokens + (now - self._at) * self.rate)
        self._at = now
