"""Who holds a port's connection slots: max-min fair shares by the caller's address among
the connections that have not proven anything, and the proven ones kept. The spoke's
peer port (its door, :mod:`strata_local.door`) and bulk peer port, and the hub's bulk
port, each keep one :class:`DoorSlots`.

gRPC core closes the connection beyond ``grpc.max_allowed_incoming_connections`` as it
arrives, so a flood of connections that never send a token — TLS handshakes left pending
for :data:`~spoke.mesh.transport.HANDSHAKE_TIMEOUT_S`, or plaintext connections idle for
:data:`~spoke.mesh.transport.IDLE_S` — kept every slot full and every new peer out
(issue 39's fourteenth probe: 40 of 40 new peer connections failed, 30 of 30 under TLS).
Here a connection is *proven* once a call on it carried the region's token (under mTLS,
after its client certificate too); a proven connection is displaced only by the rule for
proven ones below. A newcomer at
the cap displaces an unproven connection: the oldest of the address holding the most
unproven ones (the newcomer's own address included, so a flood from one address only
turns its own connections over). Spread over many addresses, a flood turns every unproven
slot over in arrival order, so a new peer keeps its slot for about (unproven slots ÷ the
flood's connections a second) — 0.85 s at 1,200 a second and 1,024 slots — while its
handshake and first call take milliseconds in one region.

Proven connections are shared by address too: when every slot is proven, a newcomer
displaces the oldest proven connection of the address holding most of them, if that
address holds at least two more than the newcomer's (the sixteenth probe: one token
holder, from one address, proved 2,048 connections to a hub and 512 to a spoke's peer
port, and every new caller was refused). A spoke holds one or two connections to a hub or
a peer, so only a holder of many loses any; the newcomer is refused only when no address
holds two more proven connections than its own.

An address is not a caller, though: one token holder spread over as many addresses as
there are slots, one proven connection each, kept every new spoke out of a hub (the
seventeenth probe: 2,048 addresses, new clients 0 of 30). So each proven connection is
also counted for whoever proved it — the token's subject, or the region on a peer port —
and when no address gives way, the newcomer displaces the oldest proven connection of the
subject holding most, if that subject holds at least two and more than its share of the
slots were the newcomer one more subject (``max_connections`` ÷ (subjects + 1)). One token
holder then keeps at most half the slots against one other, a third against two; spokes
with a token each, one connection apiece, are never displaced by it; and on a port where
every caller proves the same subject (a region's peers) a newcomer turns over the oldest
connection, at worst one a reconnection, rather than being refused forever.

And proven connections do not crowd the newcomers out: while fewer than a quarter of the
slots hold unproven connections, a newcomer displaces a proven one that gives way by those
rules before an unproven one. Else one token holder's proven connections in every slot
but one left the newcomers a single slot, which a churn of bare connects from a second
address turned over faster than a new spoke could prove itself (the eighteenth probe:
new clients 0 of 20 at 1,000 connects a second).

A connection whose caller answered the server's first flight with something the server
took — under TLS, a Finished that checked out (the stream door's TLS finished; on a gRPC
door, the caller said something after the server's first bytes, and the server spoke
again after it: gRPC speaks HTTP/2 only once the handshake is done) — is *answered*: a
live client that has spent a round trip and a key exchange of its own, where a flood's
connection sends one whole ClientHello and nothing more (or five bytes promising a
record that never comes, or a canned ClientHello after a HelloRetryRequest: the
twenty-second probe had 15,218 of 60,000 connections counted answered with the first
while the caller's bytes alone did, the twenty-third 893 of 900 with the second while a
HelloRetryRequest was a first flight; :data:`strata_local.door.FIRST_FLIGHT_LEAST`). An
answered connection that has proved nothing yet gives way only after every connection
that did not answer, while the answered are at most half the unproven connections. Else
a fleet whose handshakes had their turn was displaced while its first calls waited on
the busy server: a hub restarted under whole ClientHellos from 60,000 addresses at 4,000
a second turned each unproven slot over in about half a second, and with its known
spokes' handshakes first (:mod:`strata_local.knownhosts`) 45 of 500 were back after 30
s, each of the others displaced after its handshake, before its call proved it. Beyond
half the unproven slots the answered give way first (the oldest of the address holding
most), so a flood of full handshakes cannot leave the callers still waiting for their
turn one slot between them, which the next bare connect would take; an answered
connection that makes no call keeps its rank until the server closes it idle (gRPC: 60
s). Without TLS there is no flight to answer before a call: a plaintext caller has no
answered rank before its call proves it.

Who proved a credential from which address lately is kept (:attr:`DoorSlots.known`) for
the handshakes' turns (:mod:`strata_local.handshakes`), and only for them: an unproven
connection of such an address is displaced as any other (the twenty-first probe: kept
until every other unproven one was gone, a token holder's bare connects from its own
address, 20 a second, kept every new spoke out at 50 ms round trips).

Where these rules say the oldest proven connection, they mean the least recently used:
a proven connection moves behind its address's and its holder's others when its caller
sends something (:meth:`DoorSlots.used`, at most once a second), so a token over its share
gives up its idle connections before its busy ones.

Every operation is constant time (one arrival does not scan the slots): each kind of
connection is kept by address in arrival (proven: use) order, and the addresses by how
many they hold.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from strata_local.knownhosts import PROOF_CREDIT, KnownHosts
from strata_local.slotshare import Holders

USED_EVERY_S = 1.0
"""How often a connection's use reorders its slot, at most (seconds)."""

RESERVE = 4
"""While fewer than a ``RESERVE``-th of the slots are unproven, a newcomer displaces a
proven connection that gives way by the rules for proven ones before any unproven one."""


@dataclass(eq=False)
class DoorSlot:
    """One connection's slot.

    Attributes:
        host: The caller's address (no port; a dual-stack listener's IPv4 caller by
            its IPv4 address: :func:`strata_local.doorway.caller_address`).
        who: The caller in gRPC's form (``ipv4:10.0.0.7:51234``), for audit lines.
        close: Ends the connection (called once, when it is displaced).
        proven: Whether a call on it carried an accepted token.
        answered: Whether its caller answered the server's first flight (see the
            module); unset again when it is proven.
        holder: Who proved it (the token's subject; empty until proven).
        used: When its caller last sent something, as far as :meth:`DoorSlots.used`
            was told (monotonic seconds; 0: never).
        open: Whether it still holds its slot.
    """

    host: str
    who: str
    close: Callable[[], None] = field(repr=False)
    proven: bool = False
    answered: bool = False
    holder: str = ""
    used: float = 0.0
    open: bool = True


class DoorSlots:
    """The slots of one port (a door's, a bulk port's).

    Args:
        max_connections: Most connections open at once.
        known: Where who proved a credential from which address is kept (None: a new,
            empty one; a server passes one it saves, :mod:`strata_local.knownhosts`).

    Attributes:
        known: The addresses whose connections proved a credential lately, and who
            proved it (their handshakes' turns come first: :mod:`strata_local.handshakes`).

    Not thread-safe: one event loop owns it.
    """

    def __init__(self, max_connections: int, known: KnownHosts | None = None) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, not {max_connections}")
        self.max_connections = max_connections
        self.open = 0
        self.proven = 0  # how many open connections are proven
        self.answered = 0  # how many open unproven connections answered
        self.displaced = 0
        self.refused = 0
        self._unproven: Holders[DoorSlot] = Holders()  # unproven, not answered
        self._answered: Holders[DoorSlot] = Holders()  # unproven, answered
        self._proven: Holders[DoorSlot] = Holders()
        self._holders: Holders[DoorSlot] = Holders()  # the proven, by who proved them
        self.known = known if known is not None else KnownHosts()

    def take(self, host: str, who: str, close: Callable[[], None]) -> DoorSlot | None:
        """A slot for a new connection, displacing one at the cap (see the module).

        Args:
            host: The caller's address.
            who: The caller in gRPC's form.
            close: Ends the new connection if it is displaced later.

        Returns:
            The slot, or None when nothing may be displaced for it (the caller closes
            the newcomer).
        """
        if self.open >= self.max_connections:
            victim = None
            if self.open - self.proven < self.max_connections // RESERVE:
                victim = self._proven_victim(host)  # newcomers' room first
            if victim is None:
                victim = self._unproven_victim() or self._proven_victim(host)
            if victim is None:
                self.refused += 1
                return None
            self.release(victim)
            self.displaced += 1
            victim.close()
        slot = DoorSlot(host, who, close)
        self.open += 1
        self._unproven.add(host, slot)
        return slot

    def prove(self, slot: DoorSlot, holder: str) -> None:
        """Marks ``slot``'s connection proven by ``holder`` (a call on it carried an
        accepted token; ``holder`` is its subject). Idempotent; a slot already released is
        left alone."""
        if slot.proven or not slot.open:
            return
        self.known.add(slot.host, holder, credit=PROOF_CREDIT)
        self._unproven_pool(slot).remove(slot.host, slot)
        self.answered -= slot.answered
        slot.proven, slot.answered, slot.holder = True, False, holder
        self.proven += 1
        self._proven.add(slot.host, slot)
        self._holders.add(holder, slot)

    def answer(self, slot: DoorSlot) -> None:
        """Marks ``slot``'s caller as having answered the server's first flight (see the
        module): it gives way after the connections that have not. Idempotent; a proven
        or released slot is left alone."""
        if slot.proven or slot.answered or not slot.open:
            return
        self._unproven.remove(slot.host, slot)
        slot.answered = True
        self.answered += 1
        self._answered.add(slot.host, slot)

    def _unproven_pool(self, slot: DoorSlot) -> Holders[DoorSlot]:
        """Where an unproven ``slot`` is kept."""
        return self._answered if slot.answered else self._unproven

    def _unproven_victim(self) -> DoorSlot | None:
        """The unproven connection a newcomer displaces: the oldest of the address
        holding the most that did not answer; an answered one only when none is left, or
        when the answered are more than half the unproven (see the module)."""
        if 2 * self.answered > self.open - self.proven:
            return self._answered.oldest_of_most()
        return self._unproven.oldest_of_most() or self._answered.oldest_of_most()

    def unprove(self, slot: DoorSlot) -> None:
        """Takes ``slot``'s proof back (a later call on its connection carried no
        accepted token: the token was revoked, say), so it may be displaced as any
        connection that proved nothing. Idempotent."""
        if not slot.proven or not slot.open:
            return
        self._proven.remove(slot.host, slot)
        self._holders.remove(slot.holder, slot)
        slot.proven, slot.holder = False, ""
        self.proven -= 1
        self._unproven.add(slot.host, slot)

    def _proven_victim(self, host: str) -> DoorSlot | None:
        """The proven connection a newcomer from ``host`` displaces: the least recently
        used of the address holding most, if it holds two more than ``host``; else of the
        holder over its share (:meth:`_over_share`); else None."""
        victim = self._proven.oldest_of_most()
        if victim is not None and self._proven.most >= self._proven.held(host) + 2:
            return victim
        return self._over_share()

    def used(self, slot: DoorSlot, now: float) -> None:
        """``slot``'s caller sent something at ``now`` (monotonic seconds): a proven
        connection just used is the last of its address and its holder to give way, so
        those that give way are the least recently used (a token over its share loses its
        idle connections first; the eighteenth probe reset a fleet's busy ones). At most
        once a second a slot, constant time."""
        if now - slot.used < USED_EVERY_S or not slot.open:
            return
        slot.used = now
        if slot.proven:
            self.known.add(slot.host, slot.holder)  # still proving: known for longer
            self._proven.touch(slot.host, slot)
            self._holders.touch(slot.holder, slot)

    def _over_share(self) -> DoorSlot | None:
        """The least recently used proven connection of the holder holding most, if it
        holds at least two and more than ``max_connections`` ÷ (holders + 1); else None."""
        most, holders = self._holders.most, len(self._holders.by_host)
        if most >= 2 and most * (holders + 1) > self.max_connections:
            return self._holders.oldest_of_most()
        return None

    def release(self, slot: DoorSlot) -> None:
        """Frees ``slot`` (its connection ended). Idempotent."""
        if not slot.open:
            return
        slot.open = False
        self.open -= 1
        self.proven -= slot.proven
        self.answered -= slot.answered
        (self._proven if slot.proven else self._unproven_pool(slot)).remove(slot.host, slot)
        if slot.proven:
            self._holders.remove(slot.holder, slot)

    def unproven(self, host: str) -> list[DoorSlot]:
        """The unproven connections ``host`` holds: those not answered, oldest first, then
        the answered, oldest first."""
        return [
            *self._unproven.by_host.get(host, ()),
            *self._answered.by_host.get(host, ()),
        ]
