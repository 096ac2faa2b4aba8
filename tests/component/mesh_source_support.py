"""What the mesh source's tests (``tests/component/test_spoke_mesh_*.py``) share: a hub's
blocks from a dict (:class:`FakeHub`), grants signed by a real issuer (:data:`ISSUER`, a
keeper from :func:`_keeper`, the keys that check them from :func:`_keys`), a spoke's cache
and catalog holding a live snapshot (:func:`_cache`, :func:`_hold`), an owner spoke's peer
port (:class:`Owner`) and an asker reading it (:func:`_asker`), and a metric's value
(:func:`_sample`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Sequence
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from deploy.local import free_port
from hub.auth.grants import GrantIssuer
from hub.auth.tokens import Principal
from protocol.hub.v1 import hub_pb2
from spoke.cache.blockcache import BlockCache
from spoke.cache.lru import LRUPolicy
from spoke.cache.store import BlockStore, open_index
from spoke.catalog.catalog import SnapshotCatalog
from spoke.disk.layout import CacheLayout, block_digest
from spoke.fetch.fetcher import Fetcher
from spoke.fetch.scheduler import FetchScheduler, Priority
from spoke.hublink.client import HubClient
from spoke.mesh.admission import CallerLimits, Refusals, ScopeCheck
from spoke.mesh.grantcheck import GrantVerifier
from spoke.mesh.grants import GrantKeeper, HubGrantKeys
from spoke.mesh.membership import Membership
from spoke.mesh.peerclient import PeerClient
from spoke.mesh.peerservice import (
    PeerService,
    start_peer_server,
)
from spoke.mesh.source import MeshSource
from spoke.mesh.transport import MAX_CONNECTIONS, PeerTls, PeerToken

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
    """A spoke's peer port over a fake hub, holding ``blocks`` as a snapshot of ``ds``;
    ``refusals`` counts and audits what its admission refuses (a fresh one without audit
    log if not given)."""

    def __init__(
        self,
        root: Path,
        hub: FakeHub,
        blocks: dict[str, bytes],
        refusals: Refusals | None = None,
    ) -> None:
        self.root, self.hub, self.blocks = root, hub, blocks
        self.node = f"127.0.0.1:{free_port()}"
        self.refusals = refusals

    async def start(
        self,
        token: PeerToken | None = None,
        tls: PeerTls | None = None,
        limits: CallerLimits | None = None,
        max_connections: int = MAX_CONNECTIONS,
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
            refusals=self.refusals,
        )
        self.service = service
        self.server, _ = await start_peer_server(service, self.node, tls, max_connections)

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


def _sample(counter: object, *labels: str) -> float:
    target = counter.labels(*labels) if labels else counter  # type: ignore[attr-defined]
    return float(target._value.get())
