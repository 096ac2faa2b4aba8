"""The mesh as a :class:`~spoke.fetch.source.BlockSource`: each block from its owner, else the hub.

Every batch the fetcher asks for is split by owner (:class:`~spoke.mesh.membership.Membership`):
blocks this spoke owns go to the hub; the others go, one stream per owner, to their owner's
peer port, all at once, each with its size from this spoke's manifests (the most the owner
may send; it comes with the call, as does the batch's class, which the owner is told) and
the snapshots it comes from (so the owner can load their manifests; this
spoke's :mod:`spoke.catalog.blockscope` index). Whatever a peer cannot deliver — it is down,
answers nothing for ``step_timeout`` seconds, falls behind the pace
(:class:`~spoke.mesh.peerclient.Pace`: ``step_timeout`` plus the bytes so far at
``min_rate``), errs, declines blocks outside this spoke's grant, is over its limits, or
sends a block that fails verification or its size — goes to the hub in the same call, so
the mesh can make a read faster, never fail it. A silent, slow, corrupt or oversized peer
is counted and quarantined (:meth:`~spoke.mesh.membership.Membership.quarantine`); a peer
that declines or is busy stays in the mesh. Without a valid read grant
(:mod:`spoke.mesh.grants`) every block goes to the hub.

One call keeps to its ``timeout``: a peer gets at most :data:`PEER_SHARE` of it, and what
the peer does not deliver goes to the hub with what is left, so a read through a failing
peer never takes longer than the same read from the hub would be allowed to.

With ``--peer-bulk-port`` (:attr:`MeshSource.bulk`) the peers are read over their bulk
peer ports (:mod:`spoke.mesh.bulkclient`): the same request, pace and fallback, each block
verified and staged by a receive thread (a bad one ends the stream as ``corrupt``).

Blocks a peer asked this spoke for as their owner (:meth:`MeshSource.serving`) always go to
the hub: such a request is forwarded at most once.

Relays (:mod:`spoke.mesh.relay`): over the gRPC peer port a spoke follows relay hints. A
block the owner says is hot (asked for by :data:`~spoke.mesh.relay.RELAY_FANOUT` other
spokes lately) is asked of this spoke's relay for it, a relay request; blocks a peer asked
this spoke for in a relay request (:meth:`MeshSource.relaying`) go to this spoke's own
relay for them, or to the hub when this spoke is their owner in its view. A relay always
has a higher rendezvous score for the block than its asker, so views of the membership
that disagree for a moment cannot make a loop. What a relay does not deliver goes to the
hub, as from an owner. With ``--peer-bulk-port`` (whose requests carry no relay flags)
hints are not asked for, and relay requests this spoke gets go to the owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence

from spoke.cache.staging import Staged
from spoke.cache.store import Received
from spoke.catalog.blockscope import BlockScope
from spoke.disk.layout import block_digest
from spoke.fetch.priority import Priority
from spoke.fetch.source import BlockSource
from spoke.mesh import metrics
from spoke.mesh.bulkclient import PeerBulkClient
from spoke.mesh.grants import GrantKeeper
from spoke.mesh.membership import Membership
from spoke.mesh.peerclient import MIN_RATE_BPS, PeerError
from spoke.mesh.relay import relay_of

log = logging.getLogger(__name__)

_Item = tuple[str, Received] | BaseException

Route = tuple[str | None, bool]
"""Where a block is asked for: the peer (None: the hub) and whether as a relay request."""

STAY_LIVE = frozenset(
    {"not_found", "invalid_argument", "permission_denied", "resource_exhausted", "deadline"}
)
"""Peer errors that leave the peer in the mesh (this call's blocks come from the hub;
``deadline``: the call's own time ran out, not the peer's pace)."""

QUARANTINED = frozenset({"lying", "slow", "timeout", "corrupt"})
"""Peer errors that quarantine the peer (as a corrupt block does)."""

PEER_SHARE = 0.5
"""Most of a call's time a peer may take; the hub gets the rest for what it left."""

MIN_HUB_S = 0.05
"""Least time a fallback to the hub is given, seconds (the call's time may be spent)."""


class MeshSource:
    """Fetch blocks from their owner in the region, falling back to ``hub``.

    Args:
        hub: the hub as a source.
        membership: the live mesh.
        step_timeout: longest a peer may take for one chunk before it is skipped, seconds.
        grants: this spoke's read grant; without a valid one, peers are not asked.
        scope: this spoke's block scope index (which snapshots a block comes from).
        min_rate: the slowest pace a peer may keep, bytes per second.
        bulk: the owners' bulk peer ports (``--peer-bulk-port``); None: their gRPC peer
            ports (:class:`~spoke.mesh.peerclient.PeerClient`).
    """

    def __init__(
        self,
        hub: BlockSource,
        membership: Membership,
        step_timeout: float = 2.0,
        grants: GrantKeeper | None = None,
        scope: BlockScope | None = None,
        min_rate: float = MIN_RATE_BPS,
        bulk: PeerBulkClient | None = None,
    ) -> None:
        self.hub = hub
        self.bulk = bulk
        self.membership = membership
        self.step_timeout = step_timeout
        self.min_rate = min_rate
        self.grants = grants
        self.scope = scope
        self._serving: Counter[str] = Counter()
        self._relaying: Counter[str] = Counter()

    @property
    def name(self) -> str:
        """The hub's name: the mesh is a faster way to the same blocks."""
        return self.hub.name

    @contextlib.contextmanager
    def serving(self, digests: Sequence[str], relay: bool = False) -> Iterator[None]:
        """While inside, fetches of ``digests`` go to the hub only (a peer asked this spoke
        for them as their owner), or with ``relay`` to this spoke's relay for them (a peer
        asked this spoke as its relay)."""
        held = self._relaying if relay else self._serving
        held.update(digests)
        try:
            yield
        finally:
            held.subtract(digests)
            for digest in digests:
                if held[digest] <= 0:
                    del held[digest]

    def relaying(self, digests: Sequence[str]) -> contextlib.AbstractContextManager[None]:
        """While inside, fetches of ``digests`` go to this spoke's relay for them (the hub
        when it owns them): a peer asked this spoke for them as its relay."""
        return self.serving(digests, relay=True)

    def relay_for(self, digest: str) -> str | None:
        """This spoke's relay for ``digest`` among the live spokes (None: it owns it)."""
        return relay_of(digest, self.membership.nodes, self.membership.me)

    def route(self, digests: Sequence[str]) -> dict[Route, list[str]]:
        """Digests by where to ask (``(None, False)``: the hub), in request order."""
        routes: dict[Route, list[str]] = {}
        me = self.membership.me
        granted = self.grants is not None and self.grants.valid
        for digest in digests:
            node: str | None = None
            relay = False
            if granted and digest not in self._serving:
                if digest in self._relaying and self.bulk is None:
                    node = self.relay_for(digest)
                    relay = node is not None
                else:
                    owner = self.membership.owner(digest)
                    node = None if owner == me else owner
            label = "self" if node is None else "relay" if relay else "peer"
            metrics.ROUTED_BLOCKS.labels(label).inc()
            routes.setdefault((node, relay), []).append(digest)
        return routes

    async def read_blocks(
        self, blocks: Sequence[tuple[str, int]], timeout: float, priority: Priority
    ) -> AsyncIterator[tuple[str, Received]]:
        """As :meth:`BlockSource.read_blocks`, but in arrival order; peers' blocks are
        verified here (a bad one is fetched from the hub instead).

        Raises:
            HubUnavailable, NotFound, InvalidRequest: from the hub, for blocks it was asked.
        """
        sizes = dict(blocks)
        routes = {
            where: [(d, sizes[d]) for d in digests]
            for where, digests in self.route(list(sizes)).items()
        }
        hub_only = routes.pop((None, False), [])
        if not routes:
            async for item in self._from_hub(hub_only, timeout, priority):
                yield item
            return
        deadline = time.monotonic() + timeout
        out: asyncio.Queue[_Item] = asyncio.Queue()
        tasks = [
            asyncio.create_task(self._peer_then_hub(node, wanted, priority, deadline, out, relay))
            for (node, relay), wanted in routes.items()
            if node is not None
        ]
        if hub_only:
            hub = self._from_hub(hub_only, timeout, priority)
            tasks.append(asyncio.create_task(self._into(hub, out)))
        try:
            for _ in range(len(sizes)):
                got = await out.get()
                if isinstance(got, BaseException):
                    raise got
                yield got
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            while not out.empty():  # staged and never taken: not a block, not kept
                left = out.get_nowait()
                if isinstance(left, tuple) and isinstance(left[1], Staged):
                    left[1].discard()

    async def _from_hub(
        self, blocks: Sequence[tuple[str, int]], timeout: float, priority: Priority
    ) -> AsyncIterator[tuple[str, Received]]:
        started = time.monotonic()
        try:
            async for digest, data in self.hub.read_blocks(blocks, timeout, priority):
                metrics.SOURCE_BYTES.labels("hub").inc(len(data))
                metrics.SOURCE_BLOCKS.labels("hub").inc()
                yield digest, data
        finally:
            metrics.SOURCE_SECONDS.labels("hub").observe(time.monotonic() - started)

    @staticmethod
    async def _into(stream: AsyncIterator[tuple[str, Received]], out: asyncio.Queue[_Item]) -> None:
        try:
            async for item in stream:
                out.put_nowait(item)
        except Exception as err:  # handed to the reader, which raises it
            out.put_nowait(err)

    def _left(self, deadline: float) -> float:
        return max(deadline - time.monotonic(), MIN_HUB_S)

    async def _peer_then_hub(
        self,
        node: str,
        blocks: list[tuple[str, int]],
        priority: Priority,
        deadline: float,
        out: asyncio.Queue[_Item],
        relay: bool = False,
    ) -> None:
        """Ask ``node`` for ``blocks`` (``(digest, size)``, of class ``priority``; as their
        relay with ``relay``); what it does not deliver, verified, ask the hub (what it
        declines at once, the rest when its stream ends), all by ``deadline`` (monotonic
        seconds). What it sends to their relay (a relay hint) ask that relay; what a relay
        that is not the owner does not deliver ask the owner (as its relay: it never
        answers with a hint), then the hub, so a slow relay costs no second WAN fetch."""
        sizes = dict(blocks)
        left = dict.fromkeys(sizes)
        snapshots = self.scope.snapshots_of(list(sizes)) if self.scope is not None else []
        declined: list[asyncio.Task[None]] = []

        def to_hub(some: list[str]) -> None:
            for digest in some:
                left.pop(digest, None)
            hub = self._from_hub([(d, sizes[d]) for d in some], self._left(deadline), priority)
            declined.append(asyncio.create_task(self._into(hub, out)))

        def fallback(some: list[str]) -> None:
            if not relay:
                to_hub(some)
                return
            by_owner: dict[str | None, list[tuple[str, int]]] = {}
            for digest in some:
                left.pop(digest, None)
                owner: str | None = self.membership.owner(digest)
                if owner in (node, self.membership.me):
                    owner = None  # the relay was the owner, or this spoke is now
                by_owner.setdefault(owner, []).append((digest, sizes[digest]))
            for owner, wanted in by_owner.items():
                if owner is None:
                    to_hub([d for d, _ in wanted])
                    continue
                ask = self._peer_then_hub(owner, wanted, priority, deadline, out, relay=True)
                declined.append(asyncio.create_task(ask))

        def on_declined(some: list[str]) -> None:
            metrics.PEER_DECLINED_BLOCKS.inc(len(some))
            fallback(some)

        def on_relay(some: list[str]) -> None:
            metrics.RELAY_HINTED_BLOCKS.inc(len(some))
            by_relay: dict[str | None, list[tuple[str, int]]] = {}
            for digest in some:
                left.pop(digest, None)
                by_relay.setdefault(self.relay_for(digest), []).append((digest, sizes[digest]))
            for parent, wanted in by_relay.items():
                if parent is None:  # this spoke owns it now (the owner left its view)
                    to_hub([d for d, _ in wanted])
                    continue
                ask = self._peer_then_hub(parent, wanted, priority, deadline, out, relay=True)
                declined.append(asyncio.create_task(ask))

        started = time.monotonic()
        try:
            client = self.membership.client(node)
            corrupt = False
            args = (blocks, priority.label, (deadline - started) * PEER_SHARE, self.step_timeout)
            stream: AsyncIterator[tuple[str, Received]] = (
                self.bulk.read_blocks(node, *args, snapshots, on_declined, self.min_rate)
                if self.bulk is not None
                else client.read_blocks(
                    *args,
                    snapshots,
                    on_declined,
                    self.min_rate,
                    on_relay=None if relay else on_relay,
                    relay=relay,
                )
            )
            async for digest, data in stream:
                if digest not in left:
                    if isinstance(data, Staged):
                        data.discard()
                    continue
                if isinstance(data, bytes) and self.bulk is None and block_digest(data) != digest:
                    metrics.PEER_CORRUPT_BLOCKS.inc()
                    metrics.PEER_ERRORS.labels("corrupt").inc()
                    self.membership.quarantine(
                        node, f"served block {digest} with the wrong bytes", "corrupt"
                    )
                    corrupt = True
                    break
                del left[digest]
                if relay:
                    metrics.RELAY_RECEIVED_BLOCKS.inc()
                metrics.SOURCE_BYTES.labels("peer").inc(len(data))
                metrics.SOURCE_BLOCKS.labels("peer").inc()
                out.put_nowait((digest, data))
            if not corrupt and not any(d in left for d, _ in blocks):
                self.membership.delivered(node)
        except PeerError as err:
            metrics.PEER_ERRORS.labels(err.kind).inc()
            if err.kind == "corrupt":  # a bulk receive thread's verification
                metrics.PEER_CORRUPT_BLOCKS.inc()
            then = "owner or hub" if relay else "hub"
            log.info("%s; %d blocks from the %s instead", err, len(left), then)
            if err.kind in QUARANTINED:
                self.membership.quarantine(node, str(err), err.kind)
            elif err.kind not in STAY_LIVE:
                self.membership.mark_down(node, str(err))
        except KeyError:  # the peer left the mesh between routing and now
            metrics.PEER_ERRORS.labels("unavailable").inc()
        finally:
            metrics.SOURCE_SECONDS.labels("peer").observe(time.monotonic() - started)
        try:
            if left:
                fallback(list(left))
            await asyncio.gather(*declined)
        finally:
            for task in declined:
                task.cancel()
