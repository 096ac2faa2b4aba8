"""The mesh source and the peer service in one process: the owner fetches once for every
asker, but only blocks of its own live snapshots that the asker's grant covers; the hub's
fetch counters count the hub's blocks, not the peers'; dead and stalled peers fall back to
the hub and leave the mesh. Who the peer port lets in is in
``test_spoke_mesh_source_admission.py``.

The hub's part is real where it matters (:class:`hub.auth.grants.GrantIssuer` signs the grants
every peer checks); the hub's blocks come from a dict.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc
import grpc.aio
import pytest

from bench.liars import Stall
from deploy.local import free_port
from hub.auth.tokens import Principal
from protocol.spoke.v1 import peer_pb2_grpc
from spoke import metrics as spoke_metrics
from spoke.disk.layout import CacheLayout
from spoke.fetch.fetcher import Fetcher
from spoke.fetch.scheduler import FetchScheduler, Priority
from spoke.hublink.source import HubSource
from spoke.mesh import metrics
from spoke.mesh.membership import Membership
from spoke.mesh.peerclient import PeerClient
from spoke.mesh.rendezvous import owner
from spoke.mesh.source import MeshSource
from tests.component.mesh_source_support import (
    FakeHub,
    Owner,
    _asker,
    _blocks,
    _cache,
    _keeper,
    _live,
    _sample,
    _sized,
)

pytestmark = pytest.mark.timeout(60)


def test_the_owner_fetches_each_block_once_for_every_asker(tmp_path: Path) -> None:
    blocks = _blocks(12)

    async def go() -> tuple[list[str], list[int]]:
        owner_ = Owner(tmp_path / "owner", FakeHub(blocks, delay=0.05), blocks)
        await owner_.start()
        askers = [await _asker(owner_, blocks) for _ in range(3)]
        # each asker wants the blocks the owner owns in its view
        wanted = [[d for d in blocks if owner(d, m.nodes) == owner_.node] for _, m, _ in askers]

        async def read(source: MeshSource, digests: list[str]) -> int:
            got = {
                d: b
                async for d, b in source.read_blocks(_sized(blocks, digests), 10, Priority.DEMAND)
            }
            assert got == {d: blocks[d] for d in digests}
            return len(got)

        counts = await asyncio.gather(
            *(read(s, w) for (s, _, _), w in zip(askers, wanted, strict=True))
        )
        for _, m, hub in askers:
            assert hub.sent == []  # everything came from the owner
            await m.close()
        await owner_.stop()
        return owner_.hub.sent, list(counts)

    sent, counts = asyncio.run(go())
    assert all(counts) and len(sent) == len(set(sent))  # one hub fetch per block
    assert CacheLayout(tmp_path / "owner").block_path(sent[0]).is_file()  # the owner keeps it


def test_blocks_outside_the_grant_or_unknown_to_the_owner_come_from_the_hub(
    tmp_path: Path,
) -> None:
    # the owner owns each block with odds 1/2: enough that it owns some of each kind
    held = _blocks(32, "held")  # a snapshot of ds at the owner
    stranger = _blocks(32, "stranger")  # in no snapshot the owner stores
    both = {**held, **stranger}

    async def go() -> tuple[dict[str, bytes], FakeHub, FakeHub, set[str], set[str]]:
        owner_ = Owner(tmp_path / "owner", FakeHub(both), held)
        await owner_.start()
        # scoped to "other": the owner's ds blocks are refused, and so is what it lacks
        source, membership, hub = await _asker(owner_, both, Principal("tok-o", ("other",)))
        asked = {d for d in both if membership.owner(d) == owner_.node}
        got = {d: b async for d, b in source.read_blocks(_sized(both, both), 10, Priority.DEMAND)}
        live = set(membership.live)
        await membership.close()
        await owner_.stop()
        return got, hub, owner_.hub, live, asked

    refused0 = _sample(metrics.PEER_REFUSED_BLOCKS)
    declined0 = _sample(metrics.PEER_DECLINED_BLOCKS)
    got, hub, owner_hub, live, asked = asyncio.run(go())
    assert got == both and len(live) == 1  # declining is no fault: the owner stays live
    assert sorted(hub.sent) == sorted(both)  # every block from the asker's own hub
    assert owner_hub.sent == []  # the owner fetched nothing for it
    assert asked & set(held) and asked & set(stranger)  # both kinds were asked of it
    # one count for both kinds: whether the owner holds a digest for another tenant is
    # not for /metrics to say
    assert _sample(metrics.PEER_REFUSED_BLOCKS) - refused0 == len(asked)
    assert _sample(metrics.PEER_DECLINED_BLOCKS) - declined0 == len(asked)


class FakeHubClient:
    """What :class:`~spoke.hublink.source.HubSource` calls of a HubClient, over a dict."""

    target = "hub:0"
    refused: str | None = None

    def __init__(self, blocks: dict[str, bytes]) -> None:
        self.blocks = blocks
        self.sent: list[str] = []

    async def read_blocks(
        self, digests: Sequence[str], timeout: float
    ) -> AsyncIterator[tuple[str, bytes]]:
        for d in digests:
            self.sent.append(d)
            yield d, self.blocks[d]


def test_hub_fetch_bytes_count_the_hubs_blocks_not_the_peers(tmp_path: Path) -> None:
    """``strata_spoke_hub_fetch_bytes_total`` is the WAN traffic: a block a peer served
    through the fetcher adds nothing to it (it is ``source_bytes{source="peer"}``), a block
    from the hub adds its size (issue 27: the dashboard overstated the WAN)."""
    blocks = _blocks(16)

    async def go() -> tuple[set[str], set[str], FakeHubClient, list[str]]:
        owner_ = Owner(tmp_path / "owner", FakeHub({}), blocks)
        await owner_.start()
        source, membership, _ = await _asker(owner_, blocks)
        by_peer = {d for d in blocks if membership.owner(d) == owner_.node}
        for d in by_peer:  # the owner has them: it asks its own hub for nothing
            await owner_.cache.admit(d, blocks[d])
        hub = FakeHubClient(blocks)
        cache, _ = _cache(tmp_path / "asker")
        mesh = MeshSource(HubSource(hub), membership, grants=source.grants)  # type: ignore[arg-type]
        scheduler = FetchScheduler(Fetcher(mesh), cache)
        await scheduler.ensure(_sized(blocks, blocks))
        await scheduler.close()
        await membership.close()
        await owner_.stop()
        return by_peer, set(blocks) - by_peer, hub, owner_.hub.sent

    hub_bytes0 = _sample(spoke_metrics.HUB_FETCH_BYTES)
    hub_blocks0 = _sample(spoke_metrics.HUB_FETCH_BLOCKS)
    peer_bytes0 = _sample(metrics.SOURCE_BYTES, "peer")
    by_peer, by_hub, hub, owner_sent = asyncio.run(go())
    assert by_peer and by_hub, "the rendezvous split the blocks between owner and asker"
    assert sorted(hub.sent) == sorted(by_hub) and owner_sent == []
    assert _sample(metrics.SOURCE_BYTES, "peer") - peer_bytes0 == sum(
        len(blocks[d]) for d in by_peer
    )
    assert _sample(spoke_metrics.HUB_FETCH_BYTES) - hub_bytes0 == sum(
        len(blocks[d]) for d in by_hub
    )
    assert _sample(spoke_metrics.HUB_FETCH_BLOCKS) - hub_blocks0 == len(by_hub)


def test_dead_and_stalled_peers_fall_back_to_the_hub_and_leave_the_mesh() -> None:
    blocks = _blocks(30)

    async def go() -> tuple[dict[str, bytes], FakeHub, Membership]:
        dead = f"127.0.0.1:{free_port()}"  # nothing listens there
        slow = f"127.0.0.1:{free_port()}"
        server = grpc.aio.server()
        peer_pb2_grpc.add_SpokePeerServicer_to_server(Stall(slow), server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(slow)
        await server.start()
        me = "127.0.0.1:2"
        keeper = await _keeper(me)
        membership = Membership(me, [dead, slow], connect=lambda n: PeerClient(n, grants=keeper))
        await membership.refresh()
        _live(membership, dead, slow)  # as if both had answered the last probe
        hub = FakeHub(blocks)
        source = MeshSource(
            hub,
            membership,
            step_timeout=0.5,
            grants=keeper,
        )
        got = {
            d: b async for d, b in source.read_blocks(_sized(blocks, blocks), 30, Priority.DEMAND)
        }
        await membership.close()
        await server.stop(0)
        return got, hub, membership

    got, hub, membership = asyncio.run(go())
    assert got == blocks
    assert sorted(hub.sent) == sorted(blocks)  # every block, once, from the hub
    assert membership.nodes == ("127.0.0.1:2",)  # both peers left, their share re-hashed
