"""Who is in the region's mesh and who is live: a static ``--peers`` list and/or a DNS name
(a Kubernetes headless Service resolves to one address per spoke), probed periodically.

A peer is live after a probe it answered as itself, and down after a failed probe or a
failed call (:meth:`Membership.mark_down`), so its share of the blocks is re-hashed onto
the others at once. A peer that served a corrupt or oversized block, fell behind the pace
or went silent (:meth:`Membership.quarantine`) stays down for a quarantine whatever its
probes say: :data:`QUARANTINE_S`, doubled at each quarantine in a row up to
:data:`MAX_QUARANTINE_S`, and back to the first once it delivers a whole stream. The
owner of a block is the rendezvous winner over the live peers and this spoke
(:mod:`spoke.mesh.rendezvous`).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable, Sequence

from spoke.mesh import metrics
from spoke.mesh.peerclient import PeerClient, PeerError
from spoke.mesh.rendezvous import owner

log = logging.getLogger(__name__)

QUARANTINE_S = 30.0
"""How long a peer is left out at its first quarantine, seconds."""

MAX_QUARANTINE_S = 960.0
"""Longest quarantine, seconds (the fifth in a row: 30 s doubled four times)."""


class Membership:
    """The mesh as this spoke sees it.

    Args:
        me: this spoke's node name (``HOST:PORT``, as the others dial it).
        peers: other spokes' names (``me`` may be among them; it is skipped).
        dns: ``(name, port)`` resolved at every probe round to more peers, or None.
        connect: makes the client of a peer.
        probe_interval: seconds between probe rounds.
        probe_timeout: deadline of one probe, seconds.
    """

    def __init__(
        self,
        me: str,
        peers: Sequence[str] = (),
        dns: tuple[str, int] | None = None,
        connect: Callable[[str], PeerClient] = PeerClient,
        probe_interval: float = 2.0,
        probe_timeout: float = 1.0,
    ) -> None:
        self.me = me
        self.static = [p for p in dict.fromkeys(peers) if p != me]
        self.dns = dns
        self.connect = connect
        self.probe_interval = probe_interval
        self.probe_timeout = probe_timeout
        self.clients: dict[str, PeerClient] = {}
        self.live: set[str] = set()
        self.errors: dict[str, str] = {}  # node -> last error
        self._held_until: dict[str, float] = {}
        self._strikes: dict[str, int] = {}  # quarantines in a row, by node
        self._nodes: tuple[str, ...] = (me,)
        self._publish()

    # -- ownership -------------------------------------------------------------------------

    @property
    def nodes(self) -> tuple[str, ...]:
        """The live nodes, this spoke included, sorted."""
        return self._nodes

    def owner(self, digest: str) -> str:
        """The live node that owns ``digest`` (possibly :attr:`me`)."""
        return owner(digest, self._nodes)

    def client(self, node: str) -> PeerClient:
        """The client of a known peer.

        Raises:
            KeyError: ``node`` is not a known peer.
        """
        return self.clients[node]

    def mark_down(self, node: str, why: str, hold: float = 0.0) -> None:
        """Leave ``node`` out until a probe finds it again (not before ``hold`` seconds)."""
        if hold:
            self._held_until[node] = time.monotonic() + hold
        self.errors[node] = why
        if node in self.live:
            log.warning("peer %s down: %s", node, why)
            self.live.discard(node)
            self._publish()

    def quarantine(self, node: str, why: str, kind: str) -> float:
        """Leave ``node`` out for a quarantine (longer at each one in a row), counted by
        ``kind`` (``strata_spoke_peer_quarantines_total``).

        Returns:
            The quarantine's length, seconds.
        """
        strikes = self._strikes.get(node, 0) + 1
        self._strikes[node] = strikes
        hold = min(QUARANTINE_S * 2.0 ** (strikes - 1), MAX_QUARANTINE_S)
        metrics.PEER_QUARANTINES.labels(kind).inc()
        self.mark_down(node, f"{why} (quarantined for {hold:g} s)", hold=hold)
        return hold

    def delivered(self, node: str) -> None:
        """``node`` delivered a whole stream: its next quarantine is the first again."""
        self._strikes.pop(node, None)

    # -- probing ---------------------------------------------------------------------------

    async def resolve(self) -> list[str]:
        """Every peer name: the static ones and what the DNS name resolves to now
        (a failed lookup keeps the peers it found before)."""
        found = list(self.static)
        if self.dns is not None:
            name, port = self.dns
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(
                    name, port, type=socket.SOCK_STREAM
                )
                for *_, sockaddr in infos:
                    host = str(sockaddr[0])
                    found.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
            except OSError as err:
                log.warning("peers DNS %s: %s; keeping the peers known", name, err)
                found += [n for n in self.clients if n not in found]
        return [n for n in dict.fromkeys(found) if n != self.me]

    async def refresh(self) -> None:
        """One round: resolve the peers, close clients of those gone, probe the rest."""
        names = await self.resolve()
        for gone in set(self.clients) - set(names):
            await self.clients.pop(gone).close()
            self.live.discard(gone)
            self.errors.pop(gone, None)
        for name in names:
            if name not in self.clients:
                self.clients[name] = self.connect(name)
        results = await asyncio.gather(*(self._probe(n) for n in names))
        now = time.monotonic()
        held = self._held_until
        self.live = {
            n for n, ok in zip(names, results, strict=True) if ok and held.get(n, 0.0) <= now
        }
        self._publish()

    async def _probe(self, node: str) -> bool:
        try:
            reply = await self.clients[node].probe(self.probe_timeout)
        except PeerError as err:
            self.errors[node] = str(err)
            return False
        if reply.node != node:
            self.errors[node] = f"answers as {reply.node!r}: its --peer-advertise must be {node}"
            return False
        self.errors.pop(node, None)
        return True

    async def run(self) -> None:
        """Probe every ``probe_interval`` seconds until cancelled."""
        while True:
            try:
                await self.refresh()
            except Exception:  # never let a probe round end the mesh
                log.exception("peer probe round failed")
            await asyncio.sleep(self.probe_interval)

    async def close(self) -> None:
        """Close every peer's channel."""
        for client in self.clients.values():
            await client.close()
        self.clients.clear()

    def snapshot(self) -> dict[str, object]:
        """JSON-ready: this node, each known peer's state and last error, the owned share."""
        return {
            "node": self.me,
            "nodes_live": len(self._nodes),
            "owned_share": round(1 / len(self._nodes), 4),
            "peers": {
                n: {"live": n in self.live, "error": self.errors.get(n)}
                for n in sorted(self.clients)
            },
        }

    def _publish(self) -> None:
        self._nodes = tuple(sorted(self.live | {self.me}))
        metrics.PEERS_LIVE.set(len(self._nodes))
        metrics.OWNED_SHARE.set(1 / len(self._nodes))
