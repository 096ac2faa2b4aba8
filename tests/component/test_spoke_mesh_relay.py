"""The relay tree in one process (spoke/mesh/relay.py): a region of 20 spokes all reading
the same blocks at the same moment gets every block from the hub once, the owner sends
each to at most 8 + 8 spokes, relays serve the rest, and nothing is refused; a spoke that
does not follow relay hints (an older one) is still served by the owner.

Each spoke is the daemon's mesh parts over its own cache: a scheduler fetching through its
:class:`~spoke.mesh.source.MeshSource`, the peer port on 127.0.0.1, a read grant from the
real issuer (as in ``test_spoke_mesh_source*.py``); the hub is one dict for the region.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc.aio
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from prometheus_client import REGISTRY

from bench.liars import Stall
from deploy.local import free_port
from hub.auth.grants import GrantIssuer
from hub.auth.tokens import Principal
from protocol.hub.v1 import hub_pb2
from protocol.spoke.v1 import peer_pb2_grpc
from spoke.cache.blockcache import BlockCache
from spoke.cache.lru import LRUPolicy
from spoke.cache.store import BlockStore, open_index
from spoke.catalog.catalog import SnapshotCatalog
from spoke.disk.layout import CacheLayout, block_digest
from spoke.fetch.fetcher import Fetcher
from spoke.fetch.scheduler import FetchScheduler, Priority
from spoke.hublink.client import HubClient
from spoke.mesh.admission import ScopeCheck
from spoke.mesh.blockfile import BlockFile
from spoke.mesh.grantcheck import GrantVerifier
from spoke.mesh.grants import GrantKeeper, HubGrantKeys
from spoke.mesh.membership import Membership
from spoke.mesh.peerclient import PeerClient
from spoke.mesh.peerservice import PeerService, start_peer_server
from spoke.mesh.relay import RELAY_FANOUT
from spoke.mesh.rendezvous import ranked
from spoke.mesh.source import MeshSource

pytestmark = pytest.mark.timeout(60)

ISSUER = GrantIssuer(Ed25519PrivateKey.generate())
EVERYTHING = Principal("tok-region", ("*",))
SPOKES = 20
BLOCKS = 8


class Hub:
    """The region's hub: a dict, each block sent after ``delay`` seconds, every send counted."""

    name = "hub:0"

    def __init__(self, blocks: dict[str, bytes], delay: float) -> None:
        self.blocks, self.delay = blocks, delay
        self.sent: Counter[str] = Counter()

    async def read_blocks(
        self, blocks: Sequence[tuple[str, int]], timeout: float, priority: Priority
    ) -> AsyncIterator[tuple[str, bytes]]:
        await asyncio.sleep(self.delay)
        for digest, _ in blocks:
            self.sent[digest] += 1
            yield digest, self.blocks[digest]


class GrantingHub:
    def __init__(self, principal: Principal = EVERYTHING) -> None:
        self.principal = principal

    async def issue_grant(self, holder_key: bytes, node: str) -> hub_pb2.ReadGrant:
        request = hub_pb2.IssueGrantRequest(holder_key=holder_key, node=node)
        return ISSUER.issue(self.principal, request)


def _blocks(n: int) -> dict[str, bytes]:
    out = {}
    for i in range(n):
        data = f"relayed block {i} ".encode() * 3000
        out[block_digest(data)] = data
    return out


class Spoke:
    """One spoke of the region: cache, catalog holding the snapshot, mesh source,
    scheduler and peer port; counts the blocks its peer port sent, by digest."""

    def __init__(self, root: Path, node: str, hub: Hub) -> None:
        self.root, self.node, self.hub = root, node, hub
        self.sent: Counter[str] = Counter()

    async def start(self, peers: list[str]) -> None:
        layout = CacheLayout(self.root)
        env = open_index(layout)
        self.cache = BlockCache(BlockStore(layout, env), LRUPolicy(1 << 30), 1 << 30)
        catalog = SnapshotCatalog(HubClient("127.0.0.1:1"), env)
        blocks = self.hub.blocks
        entry = hub_pb2.ManifestEntry(
            path="f",
            type=hub_pb2.ENTRY_TYPE_FILE,
            blocks=[hub_pb2.BlockRef(digest=d, size=len(b)) for d, b in blocks.items()],
        )
        sid = block_digest("".join(blocks).encode())
        with catalog._env.begin(write=True) as txn:
            catalog.scope.index(txn, sid, [entry])
        catalog.scope.add_name(sid, "ds", "v1")
        self.grants = GrantKeeper(GrantingHub(), self.node)  # type: ignore[arg-type]
        await self.grants.fetch()
        keys = HubGrantKeys(None, pinned=Ed25519PublicKey.from_public_bytes(ISSUER.public_key))
        self.membership = Membership(
            self.node, peers, connect=lambda n: PeerClient(n, grants=self.grants)
        )
        self.source = MeshSource(
            self.hub, self.membership, step_timeout=10, grants=self.grants, scope=catalog.scope
        )
        self.scheduler = FetchScheduler(Fetcher(self.source), self.cache)
        self.service = PeerService(
            self.node,
            self.cache,
            self.scheduler,
            self.source,
            GrantVerifier(self.node, keys),
            ScopeCheck(catalog),
        )
        serve = self.service.blocks.serve

        async def counted(
            wanted: list[tuple[str, int]], priority: Priority, relay: bool = False
        ) -> AsyncIterator[tuple[str, BlockFile | bytes]]:
            async for digest, block in serve(wanted, priority, relay):
                self.sent[digest] += 1
                yield digest, block

        self.service.blocks.serve = counted  # type: ignore[method-assign]
        self.server, _ = await start_peer_server(self.service, self.node)

    async def read(self, blocks: list[tuple[str, int]]) -> dict[str, bytes]:
        """Every block through the scheduler, as a reader's miss, then its bytes."""
        _, uncached = await self.scheduler.ensure(blocks, Priority.DEMAND)
        return {d: uncached.get(d) or self.cache.store.read(d) or b"" for d, _ in blocks}

    async def stop(self) -> None:
        await self.server.stop(0)
        await self.scheduler.close()
        await self.membership.close()


def _total(name: str) -> float:
    """Every sample of a counter family, all labels together."""
    return sum(s.value for m in REGISTRY.collect() for s in m.samples if s.name == name)


def test_a_region_reading_the_same_blocks_at_once_is_served_through_relays(
    tmp_path: Path,
) -> None:
    blocks = _blocks(BLOCKS)
    sized = [(d, len(b)) for d, b in blocks.items()]
    refusals = ("strata_spoke_peer_refusals_total", "strata_spoke_peer_errors_total")

    async def go() -> None:
        hub = Hub(blocks, delay=0.3)  # every spoke's asks arrive while the owners fetch
        nodes = [f"127.0.0.1:{free_port()}" for _ in range(SPOKES)]
        spokes = [Spoke(tmp_path / f"s{i}", n, hub) for i, n in enumerate(nodes)]
        for spoke in spokes:
            await spoke.start(nodes)
        before = {name: _total(name) for name in refusals}
        relayed = _total("strata_spoke_mesh_relay_served_blocks_total")
        try:
            for spoke in spokes:
                await spoke.membership.refresh()
                assert len(spoke.membership.nodes) == SPOKES
            got = await asyncio.gather(*(s.read(sized) for s in spokes))
            assert all(g == blocks for g in got)  # every byte the hub's
            assert dict(hub.sent) == dict.fromkeys(blocks, 1)  # the WAN once per block

            by_node = {s.node: s for s in spokes}
            for digest in blocks:
                order = ranked(digest, nodes)
                owner = by_node[order[0]]
                # the first 8 askers, then ranks 1..8 asking it as their relay
                assert owner.sent[digest] <= 2 * RELAY_FANOUT, digest
                others = sum(by_node[n].sent[digest] for n in order[1:])
                assert owner.sent[digest] + others == SPOKES - 1  # one copy each asker
                assert others >= SPOKES - 1 - 2 * RELAY_FANOUT
                for node in order[1:]:
                    assert by_node[node].sent[digest] <= RELAY_FANOUT
            assert _total("strata_spoke_mesh_relay_served_blocks_total") > relayed
            assert {name: _total(name) for name in refusals} == before  # nothing refused

            # an older spoke (no follows_relays) still gets a hot block from its owner;
            # a spoke that follows the hints is sent to its relay for it
            digest, size = sized[0]
            owner_node = ranked(digest, nodes)[0]
            remembered = by_node[owner_node].service.gate.hot._askers[digest][1]
            asker = next(s for s in spokes if s.node not in remembered | {owner_node})
            client = asker.membership.client(owner_node)
            old = [b async for b in client.read_blocks([(digest, size)], "demand", 10, 5)]
            assert old == [(digest, blocks[digest])]
            hinted: list[str] = []
            new = [
                b
                async for b in client.read_blocks(
                    [(digest, size)], "demand", 10, 5, on_relay=hinted.extend
                )
            ]
            assert (new, hinted) == ([], [digest])
        finally:
            for spoke in spokes:
                await spoke.stop()

    asyncio.run(go())


def test_what_a_stalled_relay_does_not_send_comes_from_the_owner_not_the_hub(
    tmp_path: Path,
) -> None:
    # which blocks the owner owns depends on the nodes' free ports (rendezvous hashing):
    # of 6, none was its one run in eleven ((2/3)^6); of 24, one in 17,000
    blocks = _blocks(24)

    async def go() -> None:
        owner_node, asker_node, stall_node = (f"127.0.0.1:{free_port()}" for _ in range(3))
        stall = grpc.aio.server()
        peer_pb2_grpc.add_SpokePeerServicer_to_server(Stall(stall_node), stall)  # type: ignore[no-untyped-call]
        stall.add_insecure_port(stall_node)
        await stall.start()
        owner_hub, asker_hub = Hub(blocks, 0.0), Hub(blocks, 0.0)
        owner_ = Spoke(tmp_path / "owner", owner_node, owner_hub)
        asker = Spoke(tmp_path / "asker", asker_node, asker_hub)
        await owner_.start([owner_node, asker_node])
        await asker.start([owner_node, asker_node, stall_node])
        try:
            await asker.membership.refresh()
            assert len(asker.membership.nodes) == 3
            asker.source.step_timeout = 0.5
            asker.source.relay_for = lambda digest: stall_node  # type: ignore[method-assign]
            mine = [
                (d, len(b)) for d, b in blocks.items() if asker.membership.owner(d) == owner_node
            ]
            assert mine
            with asker.source.relaying([d for d, _ in mine]):  # as a relay asked for them
                got = {d: b async for d, b in asker.source.read_blocks(mine, 30, Priority.DEMAND)}
            assert got == {d: blocks[d] for d, _ in mine}
            assert not asker_hub.sent  # the stalled relay's blocks came from the owner
            assert dict(owner_hub.sent) == dict.fromkeys(got, 1)
            assert stall_node not in asker.membership.nodes  # quarantined, as a silent peer
        finally:
            await asker.stop()
            await owner_.stop()
            await stall.stop(0)

    asyncio.run(go())


def test_a_relay_serves_only_what_the_callers_grant_covers(tmp_path: Path) -> None:
    blocks = _blocks(3)
    sized = [(d, len(b)) for d, b in blocks.items()]

    async def go() -> None:
        relay_node, asker_node = (f"127.0.0.1:{free_port()}" for _ in range(2))
        relay_hub = Hub(blocks, 0.0)
        relay = Spoke(tmp_path / "relay", relay_node, relay_hub)
        await relay.start([relay_node])  # holds the snapshot, of "ds"
        try:
            for principal, served in (
                (Principal("tok-other", ("other*",)), False),
                (EVERYTHING, True),
            ):
                keeper = GrantKeeper(GrantingHub(principal), asker_node)  # type: ignore[arg-type]
                await keeper.fetch()
                client = PeerClient(relay_node, grants=keeper)
                declined: list[str] = []
                got = [
                    b
                    async for b in client.read_blocks(
                        sized, "demand", 10, 5, on_declined=declined.extend, relay=True
                    )
                ]
                await client.close()
                if served:
                    assert dict(got) == blocks and not declined
                else:  # outside the grant: declined, and nothing fetched for it
                    assert got == [] and sorted(declined) == sorted(blocks)
                    assert not relay_hub.sent
        finally:
            await relay.stop()

    asyncio.run(go())
