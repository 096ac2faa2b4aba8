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
after its client certificate too); a proven connection is never displaced. A newcomer at
the cap displaces an unproven connection: the oldest of the address holding the most
unproven ones (the newcomer's own address included, so a flood from one address only
turns its own connections over). Spread over many addresses, a flood turns every unproven
slot over in arrival order, so a new peer keeps its slot for about (unproven slots ÷ the
flood's connections a second) — 0.85 s at 1,200 a second and 1,024 slots — while its
handshake and first call take milliseconds in one region. When every slot is proven the
newcomer is refused.

Every operation is constant time (one arrival does not scan the slots): unproven
connections are kept by address in arrival order, and the addresses by how many they hold.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(eq=False)
class DoorSlot:
    """One connection's slot.

    Attributes:
        host: The caller's address (no port).
        who: The caller in gRPC's form (``ipv4:10.0.0.7:51234``), for audit lines.
        close: Ends the connection (called once, when it is displaced).
        proven: Whether a call on it carried the region's token.
    """

    host: str
    who: str
    close: Callable[[], None] = field(repr=False)
    proven: bool = False
    open: bool = True


class DoorSlots:
    """The slots of one port (the gRPC peer port's door, the bulk peer port).

    Args:
        max_connections: Most connections open at once (``--peer-max-connections``).

    Not thread-safe: one event loop owns it.
    """

    def __init__(self, max_connections: int) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, not {max_connections}")
        self.max_connections = max_connections
        self.open = 0
        self.proven = 0
        self.displaced = 0
        self.refused = 0
        # unproven connections by host, each in arrival order (dicts keep insertion order)
        self._unproven: dict[str, dict[DoorSlot, None]] = {}
        # hosts by how many unproven connections they hold, each bucket in arrival order
        self._by_count: dict[int, dict[str, None]] = {}
        self._most = 0

    def take(self, host: str, who: str, close: Callable[[], None]) -> DoorSlot | None:
        """A slot for a new connection, displacing an unproven one at the cap.

        Args:
            host: The caller's address.
            who: The caller in gRPC's form.
            close: Ends the new connection if it is displaced later.

        Returns:
            The slot, or None when every slot is held by a proven connection (the caller
            closes the newcomer).
        """
        if self.open >= self.max_connections:
            victim = self._victim()
            if victim is None:
                self.refused += 1
                return None
            self.release(victim)
            self.displaced += 1
            victim.close()
        slot = DoorSlot(host, who, close)
        self.open += 1
        self._add(slot)
        return slot

    def prove(self, slot: DoorSlot) -> None:
        """Marks ``slot``'s connection proven (a call on it carried the token): kept from
        now on. Idempotent; a slot already released is left alone."""
        if slot.proven or not slot.open:
            return
        self._remove(slot)
        slot.proven = True
        self.proven += 1

    def release(self, slot: DoorSlot) -> None:
        """Frees ``slot`` (its connection ended). Idempotent."""
        if not slot.open:
            return
        slot.open = False
        self.open -= 1
        if slot.proven:
            self.proven -= 1
        else:
            self._remove(slot)

    def unproven(self, host: str) -> list[DoorSlot]:
        """The unproven connections ``host`` holds, oldest first."""
        return list(self._unproven.get(host, ()))

    def _victim(self) -> DoorSlot | None:
        if not self._most:
            return None
        host = next(iter(self._by_count[self._most]))
        return next(iter(self._unproven[host]))

    def _add(self, slot: DoorSlot) -> None:
        held = self._unproven.setdefault(slot.host, {})
        self._move(slot.host, len(held), len(held) + 1)
        held[slot] = None

    def _remove(self, slot: DoorSlot) -> None:
        held = self._unproven[slot.host]
        del held[slot]
        self._move(slot.host, len(held) + 1, len(held))
        if not held:
            del self._unproven[slot.host]

    def _move(self, host: str, before: int, after: int) -> None:
        """Moves ``host`` from the bucket of ``before`` unproven connections to ``after``'s."""
        if before:
            bucket = self._by_count[before]
            del bucket[host]
            if not bucket:
                del self._by_count[before]
        if after:
            self._by_count.setdefault(after, {})[host] = None
        if after > self._most:
            self._most = after
        while self._most and self._most not in self._by_count:
            self._most -= 1
