"""The mesh as a :class:`~spoke.source.BlockSource`: each block from its owner, else the hub.

Every batch the fetcher asks for is split by owner (:class:`~spoke.mesh.membership.Membership`):
blocks this spoke owns go to the hub; the others go, one stream per owner, to their owner's
peer port, all at once, each with its size from this spoke's manifests (the most the owner
may send) and the snapshots it comes from (so the owner can load their manifests; this
spoke's :mod:`spoke.blockscope` index). Whatever a peer cannot deliver — it is down,
answers nothing for ``step_timeout`` seconds, errs, declines blocks outside this spoke's
grant, is over its limits, or sends a block that fails verification or its size — goes to
the hub in the same call, so the mesh can make a read faster, never fail it. A corrupt or
oversized block is counted, and its sender is quarantined
(:data:`~spoke.mesh.membership.QUARANTINE_S`); a peer that declines or is busy stays in the
mesh. Without a valid read grant (:mod:`spoke.mesh.grants`) every block goes to the hub.

Blocks a peer asked this spoke for (:meth:`MeshSource.serving`) always go to the hub: a
request is forwarded at most once, so views of the membership that disagree for a moment
cannot make a loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Sequence

from spoke.blockscope import BlockScope
from spoke.layout import block_digest
from spoke.mesh import metrics
from spoke.mesh.grants import GrantKeeper
from spoke.mesh.membership import QUARANTINE_S, Membership
from spoke.mesh.peerclient import PeerError
from spoke.scheduler import Priority
from spoke.source import BlockSource

log = logging.getLogger(__name__)

_Item = tuple[str, bytes] | BaseException

STAY_LIVE = frozenset({"not_found", "invalid_argument", "permission_denied", "resource_exhausted"})
"""Peer errors that leave the peer in the mesh (this call's blocks come from the hub)."""

QUARANTINED = frozenset({"lying"})
"""Peer errors that leave the peer out for :data:`QUARANTINE_S` (as a corrupt block does)."""


class MeshSource:
    """Fetch blocks from their owner in the region, falling back to ``hub``.

    Args:
        hub: the hub as a source.
        membership: the live mesh.
        step_timeout: longest a peer may take for one chunk before it is skipped, seconds.
        request_of: ``digest -> (size, class)`` of a fetch in flight (the scheduler's
            :meth:`~spoke.scheduler.FetchScheduler.request_of`); set once the scheduler exists.
            A block whose size it does not know is never asked of a peer.
        grants: this spoke's read grant; without a valid one, peers are not asked.
        scope: this spoke's block scope index (which snapshots a block comes from).
    """

    def __init__(
        self,
        hub: BlockSource,
        membership: Membership,
        step_timeout: float = 2.0,
        request_of: Callable[[str], tuple[int, Priority] | None] | None = None,
        grants: GrantKeeper | None = None,
        scope: BlockScope | None = None,
    ) -> None:
        self.hub = hub
        self.membership = membership
        self.step_timeout = step_timeout
        self.request_of = request_of or (lambda digest: None)
        self.grants = grants
        self.scope = scope
        self._serving: Counter[str] = Counter()

    @property
    def name(self) -> str:
        """The hub's name: the mesh is a faster way to the same blocks."""
        return self.hub.name

    @contextlib.contextmanager
    def serving(self, digests: Sequence[str]) -> Iterator[None]:
        """While inside, fetches of ``digests`` go to the hub only (a peer asked for them)."""
        self._serving.update(digests)
        try:
            yield
        finally:
            self._serving.subtract(digests)
            for digest in digests:
                if self._serving[digest] <= 0:
                    del self._serving[digest]

    def route(self, digests: Sequence[str]) -> dict[str | None, list[str]]:
        """Digests by the peer to ask (``None``: the hub), in request order."""
        routes: dict[str | None, list[str]] = {}
        me = self.membership.me
        granted = self.grants is not None and self.grants.valid
        for digest in digests:
            node: str | None = None
            if granted and digest not in self._serving and self.request_of(digest) is not None:
                owner = self.membership.owner(digest)
                node = None if owner == me else owner
            metrics.ROUTED_BLOCKS.labels("self" if node is None else "peer").inc()
            routes.setdefault(node, []).append(digest)
        return routes

    async def read_blocks(
        self, digests: Sequence[str], timeout: float
    ) -> AsyncIterator[tuple[str, bytes]]:
        """As :meth:`BlockSource.read_blocks`, but in arrival order; peers' blocks are
        verified here (a bad one is fetched from the hub instead).

        Raises:
            HubUnavailable, NotFound, InvalidRequest: from the hub, for blocks it was asked.
        """
        routes = self.route(digests)
        hub_only = routes.pop(None, [])
        if not routes:
            async for item in self._from_hub(hub_only, timeout):
                yield item
            return
        out: asyncio.Queue[_Item] = asyncio.Queue()
        tasks = [
            asyncio.create_task(self._peer_then_hub(node, wanted, timeout, out))
            for node, wanted in routes.items()
            if node is not None
        ]
        if hub_only:
            tasks.append(asyncio.create_task(self._into(self._from_hub(hub_only, timeout), out)))
        try:
            for _ in range(len(digests)):
                got = await out.get()
                if isinstance(got, BaseException):
                    raise got
                yield got
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _from_hub(
        self, digests: Sequence[str], timeout: float
    ) -> AsyncIterator[tuple[str, bytes]]:
        started = time.monotonic()
        try:
            async for digest, data in self.hub.read_blocks(digests, timeout):
                metrics.SOURCE_BYTES.labels("hub").inc(len(data))
                metrics.SOURCE_BLOCKS.labels("hub").inc()
                yield digest, data
        finally:
            metrics.SOURCE_SECONDS.labels("hub").observe(time.monotonic() - started)

    @staticmethod
    async def _into(stream: AsyncIterator[tuple[str, bytes]], out: asyncio.Queue[_Item]) -> None:
        try:
            async for item in stream:
                out.put_nowait(item)
        except Exception as err:  # handed to the reader, which raises it
            out.put_nowait(err)

    async def _peer_then_hub(
        self, node: str, digests: list[str], timeout: float, out: asyncio.Queue[_Item]
    ) -> None:
        """Ask ``node`` for ``digests``; what it does not deliver, verified, ask the hub
        (what it declines at once, the rest when its stream ends)."""
        left = dict.fromkeys(digests)
        blocks = []
        urgent = Priority.FILL
        unsized = []  # finished meanwhile: nothing caps what a peer would send
        for digest in digests:
            request = self.request_of(digest)
            if request is None:
                unsized.append(digest)
                continue
            blocks.append((digest, request[0]))
            urgent = min(urgent, request[1])
        snapshots = self.scope.snapshots_of(digests) if self.scope is not None else []
        declined: list[asyncio.Task[None]] = []

        def to_hub(some: list[str]) -> None:
            for digest in some:
                left.pop(digest, None)
            declined.append(asyncio.create_task(self._into(self._from_hub(some, timeout), out)))

        def on_declined(some: list[str]) -> None:
            metrics.PEER_DECLINED_BLOCKS.inc(len(some))
            to_hub(some)

        if unsized:
            to_hub(unsized)

        started = time.monotonic()
        try:
            if blocks:
                client = self.membership.client(node)
                async for digest, data in client.read_blocks(
                    blocks,
                    urgent.label,
                    timeout,
                    self.step_timeout,
                    snapshots=snapshots,
                    on_declined=on_declined,
                ):
                    if digest not in left:
                        continue
                    if block_digest(data) != digest:
                        metrics.PEER_CORRUPT_BLOCKS.inc()
                        metrics.PEER_ERRORS.labels("corrupt").inc()
                        self.membership.mark_down(
                            node, f"served block {digest} with the wrong bytes", hold=QUARANTINE_S
                        )
                        break
                    del left[digest]
                    metrics.SOURCE_BYTES.labels("peer").inc(len(data))
                    metrics.SOURCE_BLOCKS.labels("peer").inc()
                    out.put_nowait((digest, data))
        except PeerError as err:
            metrics.PEER_ERRORS.labels(err.kind).inc()
            log.info("%s; %d blocks from the hub instead", err, len(left))
            if err.kind in QUARANTINED:
                self.membership.mark_down(node, str(err), hold=QUARANTINE_S)
            elif err.kind not in STAY_LIVE:
                self.membership.mark_down(node, str(err))
        except KeyError:  # the peer left the mesh between routing and now
            metrics.PEER_ERRORS.labels("unavailable").inc()
        finally:
            metrics.SOURCE_SECONDS.labels("peer").observe(time.monotonic() - started)
        try:
            if left:
                await self._into(self._from_hub(list(left), timeout), out)
            await asyncio.gather(*declined)
        finally:
            for task in declined:
                task.cancel()
