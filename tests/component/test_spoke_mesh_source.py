"""The mesh source and the peer service in one process: the owner fetches once for every
asker, but only blocks of its own live snapshots that the asker's grant covers; a token
is required (and rotates with a grace); dead, stalled and busy peers fall back to the hub.

The hub's part is real where it matters (:class:`hub.auth.grants.GrantIssuer` signs the grants
every peer checks); the hub's blocks come from a dict.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Sequence
from pathlib import Path

import grpc
import grpc.aio
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from bench.liars import Stall
from deploy.local import free_port
from deploy.pki import LocalCa
from hub.auth.grants import GrantIssuer
from hub.auth.tokens import Principal
from protocol.hub.v1 import hub_pb2
from protocol.spoke.v1 import peer_pb2, peer_pb2_grpc
from spoke import metrics as spoke_metrics
from spoke.cache.blockcache import BlockCache
from spoke.cache.lru import LRUPolicy
from spoke.cache.store import BlockStore, open_index
from spoke.catalog.catalog import SnapshotCatalog
from spoke.disk.layout import CacheLayout, block_digest
from spoke.fetch.fetcher import Fetcher
from spoke.fetch.scheduler import FetchScheduler, Priority
from spoke.hublink.client import HubClient
from spoke.hublink.source import HubSource
from spoke.mesh import metrics
from spoke.mesh.admission import CallerLimits, ScopeCheck
from spoke.mesh.grantcheck import GrantVerifier
from spoke.mesh.grants import GrantKeeper, HubGrantKeys
from spoke.mesh.membership import Membership
from spoke.mesh.peerclient import PeerClient
from spoke.mesh.peerservice import (
    PROBE_CALLS,
    PROBE_CALLS_PER_HOST,
    PeerService,
    start_peer_server,
)
from spoke.mesh.rendezvous import owner
from spoke.mesh.source import MeshSource
from spoke.mesh.transport import PeerTls, PeerToken
from tests.support import eventually_async

pytestmark = pytest.mark.timeout(60)

ISSUER = GrantIssuer(Ed25519PrivateKey.generate())
EVERYTHING = Principal("tok-all", ("*",))


class FakeHub:
    """A BlockSource serving a dict; counts every block it sends."""

    name = "hub:0"

    def __init__(self, blocks: dict[str, bytes], delay: float = 0.0) -> None:
        self.blocks = blocks
        self.sent: list[str] = []
        self.delay = delay

    async def read_blocks(
        self, blocks: Sequence[tuple[str, int]], timeout: float, priority: Priority
    ) -> AsyncIterator[tuple[str, bytes]]:
        digests = [d for d, _ in blocks]
        await asyncio.sleep(self.delay)
        for d in digests:
            self.sent.append(d)
            yield d, self.blocks[d]


class GrantingHub:
    """The hub calls a keeper makes, answered by the real issuer for ``principal``."""

    def __init__(self, principal: Principal) -> None:
        self.principal = principal

    async def issue_grant(self, holder_key: bytes, node: str) -> hub_pb2.ReadGrant:
        return ISSUER.issue(
            self.principal, hub_pb2.IssueGrantRequest(holder_key=holder_key, node=node)
        )


def _keys() -> HubGrantKeys:
    return HubGrantKeys(None, pinned=Ed25519PublicKey.from_public_bytes(ISSUER.public_key))


async def _keeper(node: str, principal: Principal = EVERYTHING) -> GrantKeeper:
    keeper = GrantKeeper(GrantingHub(principal), node)  # type: ignore[arg-type]
    await keeper.fetch()
    return keeper


def _blocks(n: int, seed: str = "block") -> dict[str, bytes]:
    out = {}
    for i in range(n):
        data = f"{seed} {i} ".encode() * 700
        out[block_digest(data)] = data
    return out


def _cache(root: Path) -> tuple[BlockCache, SnapshotCatalog]:
    layout = CacheLayout(root)
    env = open_index(layout)
    cache = BlockCache(BlockStore(layout, env), LRUPolicy(1 << 30), 1 << 30)
    return cache, SnapshotCatalog(HubClient("127.0.0.1:1"), env)


def _hold(catalog: SnapshotCatalog, dataset: str, blocks: dict[str, bytes]) -> None:
    """Record ``blocks`` as one file of a stored, live snapshot of ``dataset`` (what the
    catalog does when it stores a manifest)."""
    sid = block_digest((dataset + "".join(blocks)).encode())
    entry = hub_pb2.ManifestEntry(
        path="f",
        type=hub_pb2.ENTRY_TYPE_FILE,
        blocks=[hub_pb2.BlockRef(digest=d, size=len(b)) for d, b in blocks.items()],
    )
    with catalog._env.begin(write=True) as txn:
        catalog.scope.index(txn, sid, [entry])
    catalog.scope.add_name(sid, dataset, "v1")


def _live(membership: Membership, *nodes: str) -> None:
    membership.live = set(nodes)
    membership._publish()


def _sized(blocks: dict[str, bytes], digests: Iterable[str]) -> list[tuple[str, int]]:
    """``(digest, size)`` of ``digests`` for a source read without a scheduler: sizes
    from the manifest."""
    return [(d, len(blocks[d])) for d in digests]


class Owner:
    """A spoke's peer port over a fake hub, holding ``blocks`` as a snapshot of ``ds``."""

    def __init__(self, root: Path, hub: FakeHub, blocks: dict[str, bytes]) -> None:
        self.root, self.hub, self.blocks = root, hub, blocks
        self.node = f"127.0.0.1:{free_port()}"

    async def start(
        self,
        token: PeerToken | None = None,
        tls: PeerTls | None = None,
        limits: CallerLimits | None = None,
    ) -> None:
        cache, catalog = _cache(self.root)
        _hold(catalog, "ds", self.blocks)
        self.cache = cache
        source = MeshSource(self.hub, Membership(self.node))
        self.scheduler = FetchScheduler(Fetcher(source), cache)
        service = PeerService(
            self.node,
            cache,
            self.scheduler,
            source,
            GrantVerifier(self.node, _keys()),
            ScopeCheck(catalog),
            token=token,
            limits=limits,
        )
        self.service = service
        self.server, _ = await start_peer_server(service, self.node, tls)

    async def stop(self) -> None:
        await self.server.stop(0)
        await self.scheduler.close()


async def _asker(
    owner: Owner, blocks: dict[str, bytes], principal: Principal = EVERYTHING
) -> tuple[MeshSource, Membership, FakeHub]:
    me = f"127.0.0.1:{free_port()}"
    keeper = await _keeper(me, principal)
    membership = Membership(me, [owner.node], connect=lambda n: PeerClient(n, grants=keeper))
    await membership.refresh()
    assert membership.live == {owner.node}
    hub = FakeHub(blocks)
    source = MeshSource(hub, membership, grants=keeper)
    return source, membership, hub


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


def _sample(counter: object, *labels: str) -> float:
    target = counter.labels(*labels) if labels else counter  # type: ignore[attr-defined]
    return float(target._value.get())


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


def test_a_peer_token_is_required_and_rotates_with_a_grace(tmp_path: Path) -> None:
    blocks = _blocks(4)
    token_file = tmp_path / "token"
    token_file.write_text("first-token-0123456789\n")
    now = [0.0]
    server_token = PeerToken(token_file, grace_s=60, now=lambda: now[0])

    async def probe(token: PeerToken | None) -> str:
        client = PeerClient(owner_.node, token)
        try:
            await client.probe(5)
            return "OK"
        except Exception as err:
            return getattr(err, "kind", repr(err))
        finally:
            await client.close()

    async def go() -> list[str]:
        await owner_.start(token=server_token)
        old = tmp_path / "old"
        old.write_text("first-token-0123456789\n")
        wrong = tmp_path / "wrong"
        wrong.write_text("not-the-token-01234567\n")
        results = [await probe(PeerToken(old)), await probe(PeerToken(wrong)), await probe(None)]
        token_file.write_text("second-token-987654321\n")  # rotated on the owner
        results.append(await probe(PeerToken(old)))  # within the grace: still accepted
        results.append(await probe(PeerToken(token_file)))  # the new one too
        now[0] = 61.0
        results.append(await probe(PeerToken(old)))  # after the grace: refused
        await owner_.stop()
        return results

    owner_ = Owner(tmp_path / "owner", FakeHub(blocks), blocks)
    assert asyncio.run(go()) == ["OK", "refused", "refused", "OK", "OK", "refused"]


def test_a_caller_over_its_limits_is_sent_to_the_hub_and_the_peer_stays(tmp_path: Path) -> None:
    # enough blocks that the owner owns some of them whatever the two nodes' ports (each
    # block is the asker's own with odds 1/2: with 8, none went to the owner once in CI)
    blocks = _blocks(40)

    async def go() -> tuple[dict[str, bytes], FakeHub, set[str], list[str], list[str]]:
        owner_ = Owner(tmp_path / "owner", FakeHub(blocks), blocks)
        # at most 100 bytes in flight per caller: smaller than any one block
        await owner_.start(limits=CallerLimits(calls=4, nbytes=100))
        source, membership, hub = await _asker(owner_, blocks)
        asked = [d for d in blocks if membership.owner(d) == owner_.node]
        got = {
            d: b async for d, b in source.read_blocks(_sized(blocks, blocks), 10, Priority.DEMAND)
        }
        live = set(membership.live)
        await membership.close()
        await owner_.stop()
        return got, hub, live, owner_.hub.sent, asked

    before = _sample(metrics.PEER_ERRORS, "resource_exhausted")
    got, hub, live, owner_sent, asked = asyncio.run(go())
    assert asked  # the peer was asked: its refusal is what is under test
    assert got == blocks and sorted(hub.sent) == sorted(blocks) and owner_sent == []
    assert len(live) == 1  # still in the mesh
    assert _sample(metrics.PEER_ERRORS, "resource_exhausted") - before == 1


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


def test_mtls_admits_the_region_and_refuses_a_foreign_certificate(tmp_path: Path) -> None:
    blocks = _blocks(4)
    (tmp_path / "region").mkdir()
    (tmp_path / "foreign").mkdir()
    region = LocalCa(tmp_path / "region", "region-ca")
    leaf = region.issue("spoke", dns=(), ips=("127.0.0.1",))
    tls = PeerTls(leaf.cert, leaf.key, region.cert)
    stranger = LocalCa(tmp_path / "foreign", "foreign-ca").issue("intruder")
    intruder = PeerTls(stranger.cert, stranger.key, region.cert)

    async def go() -> tuple[dict[str, bytes], str | None]:
        owner_ = Owner(tmp_path / "owner", FakeHub(blocks), blocks)
        await owner_.start(tls=tls)
        keeper = await _keeper("127.0.0.1:1")
        good = Membership(
            "127.0.0.1:1", [owner_.node], connect=lambda n: PeerClient(n, None, tls, keeper)
        )
        bad = Membership(
            "127.0.0.1:1", [owner_.node], connect=lambda n: PeerClient(n, None, intruder, keeper)
        )
        await good.refresh()
        await bad.refresh()
        client = good.client(owner_.node)
        sized = [(d, len(b)) for d, b in blocks.items()]
        got = {d: b async for d, b in client.read_blocks(sized, "demand", 10, 5)}
        refused = None if owner_.node in bad.live else bad.errors.get(owner_.node)
        await good.close()
        await bad.close()
        await owner_.stop()
        return got, refused

    got, refused = asyncio.run(go())
    assert got == blocks
    assert refused is not None


def test_probe_calls_are_counted_until_done_and_capped(tmp_path: Path) -> None:
    """More Probe calls in turn than PROBE_CALLS are all answered (each is given back when
    done); with the count at the cap, the next is refused RESOURCE_EXHAUSTED."""
    blocks = _blocks(2)

    async def go() -> tuple[grpc.StatusCode, grpc.StatusCode, grpc.StatusCode]:
        owner_ = Owner(tmp_path / "owner", FakeHub(blocks), blocks)
        await owner_.start()
        try:
            async with grpc.aio.insecure_channel(owner_.node) as channel:
                stub = peer_pb2_grpc.SpokePeerStub(channel)
                for _ in range(PROBE_CALLS + 8):
                    reply = await stub.Probe(peer_pb2.ProbeRequest(), timeout=10)
                    assert reply.node == owner_.node
                service = owner_.service
                await eventually_async(lambda: service.probing == 0, "every Probe given back")
                service.probing = PROBE_CALLS  # as if that many replies waited unread
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.Probe(peer_pb2.ProbeRequest(), timeout=10)
                service.probing = 0
                # one host's share (the sixth probe: one host's unread calls held them all)
                service._probing_by["ipv4:127.0.0.1"] = PROBE_CALLS_PER_HOST
                with pytest.raises(grpc.aio.AioRpcError) as one_host:
                    await stub.Probe(peer_pb2.ProbeRequest(), timeout=10)
                service._probing_by["ipv4:127.0.0.1"] = PROBE_CALLS_PER_HOST - 1
                await stub.Probe(peer_pb2.ProbeRequest(), timeout=10)  # under it: answered
                await eventually_async(
                    lambda: service._probing_by["ipv4:127.0.0.1"] == PROBE_CALLS_PER_HOST - 1,
                    "the answered Probe given back",
                )
                del service._probing_by["ipv4:127.0.0.1"]
                return refused.value.code(), one_host.value.code(), grpc.StatusCode.OK
        finally:
            await owner_.stop()

    total, host, under = asyncio.run(go())
    assert total == host == grpc.StatusCode.RESOURCE_EXHAUSTED and under == grpc.StatusCode.OK
