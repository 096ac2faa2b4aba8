"""The mesh's trust between tenants on 127.0.0.1, through real daemons: two tenants behind
one TLS hub with tokens, a spoke scoped to ``a`` cannot get ``b``'s blocks from its peer
(cached there or not, with the region token, without one, with a grant of its own), and
loses ``a`` on its peers within a grant's lifetime once its token is narrowed. What the
peer port itself refuses or queues is in ``test_spoke_mesh_trust_port.py``."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio
import httpx
import pytest

from deploy.local import admin_headers
from deploy.pki import LocalCa
from protocol.hub.v1 import hub_pb2
from spoke.disk.layout import CacheLayout, block_digest
from spoke.hublink.client import HubClient
from spoke.hublink.credentials import HubCredentials
from spoke.mesh.grantcheck import SKEW_S
from spoke.mesh.grants import GrantKeeper
from spoke.mesh.rendezvous import owner
from tests.integration.mesh_support import (
    BLOCK,
    Region,
    Spoke,
    manifest_blocks,
    read_all,
    wait_until,
)
from tests.integration.mesh_trust_support import Peer
from tests.support import eventually_async, publish

pytestmark = pytest.mark.timeout(240)

TOKEN_A = "tenant-a-reader-0123456789abcdef"
TOKEN_AB = "tenant-ab-reader-fedcba9876543210"
LIFETIME_S = 3.0


@dataclass
class Tenants:
    """A TLS hub with tokens behind the WAN; spoke ``x`` reads ``a``, spoke ``y`` ``a`` and
    ``b``, in one mesh."""

    region: Region
    tokens: Path
    ca: Path
    token_a: Path
    x: Spoke
    y: Spoke

    def keeper(self, token: Path, node: str = "127.0.0.1:9") -> GrantKeeper:
        """A grant holder of our own (an attacker's spoke, or a tenant's) for ``token``."""
        hub = HubClient(
            self.region.wan.address, credentials=HubCredentials(ca=self.ca, token_file=token)
        )
        return GrantKeeper(hub, node)


def _tree(root: Path, name: str, files: int) -> Path:
    src = root / f"src-{name}"
    src.mkdir()
    for i in range(files):
        (src / f"{name}{i}.bin").write_bytes(os.urandom(3 * BLOCK + 1000))
    return src


@pytest.fixture(scope="module")
def tenants(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenants]:
    """One region for the two tenant tests: the first only reads (its counts are deltas);
    the second, which narrows ``x``'s token for good, runs after it."""
    tmp_path = tmp_path_factory.mktemp("tenants")
    hub_dir = tmp_path / "hub"
    for name in ("a", "b"):
        assert publish(hub_dir, name, _tree(tmp_path, name, 6), "--block-size", str(BLOCK))
    (tmp_path / "hub-pki").mkdir()
    ca = LocalCa(tmp_path / "hub-pki", "hub-ca")
    leaf = ca.issue("hub")
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(f'"{TOKEN_A}": ["a"]\n"{TOKEN_AB}": ["a", "b"]\n')
    token_a, token_ab = tmp_path / "token-a", tmp_path / "token-ab"
    token_a.write_text(TOKEN_A + "\n")
    token_ab.write_text(TOKEN_AB + "\n")
    region = Region(tmp_path)
    try:
        region.start_hub(
            "--tls-cert",
            str(leaf.cert),
            "--tls-key",
            str(leaf.key),
            "--tokens",
            str(tokens),
            "--grant-lifetime",
            str(LIFETIME_S),
        )
        x = region.add("x", ("--hub-ca", str(ca.cert), "--hub-token-file", str(token_a)))
        y = region.add("y", ("--hub-ca", str(ca.cert), "--hub-token-file", str(token_ab)))
        region.start(x)
        region.start(y)
        region.wait_live([x, y], 2)
        yield Tenants(region, tokens, ca.cert, token_a, x, y)
    finally:
        region.close()


def _series(spoke: Spoke) -> dict[str, float]:
    """The peer refusal series of a spoke's /metrics (the node's token), by name and labels."""
    text = httpx.get(f"{spoke.admin}/metrics", headers=admin_headers(spoke.cache), timeout=10).text
    lines = (line.rpartition(" ") for line in text.splitlines() if not line.startswith("#"))
    return {k: float(v) for k, _, v in lines if k.startswith("strata_spoke_peer_refus")}


def _owned_by(spoke: Spoke, nodes: list[Spoke], blocks: list[tuple[str, int]]) -> list[str]:
    return [d for d, _ in blocks if owner(d, [s.node for s in nodes]) == spoke.node]


def test_a_spoke_scoped_to_a_gets_no_block_of_b_from_a_peer(tenants: Tenants) -> None:
    x, y = tenants.x, tenants.y
    a_blocks = manifest_blocks(y, "a")
    b_blocks = manifest_blocks(y, "b")
    read_all(y, b_blocks[: len(b_blocks) // 2])  # y caches half of b
    cached = _owned_by(y, [x, y], b_blocks[: len(b_blocks) // 2])
    uncached = _owned_by(y, [x, y], b_blocks[len(b_blocks) // 2 :])
    assert cached and uncached
    y_hub_blocks = y.metric("strata_spoke_source_blocks_total", source="hub")
    declined0 = y.metric("strata_spoke_peer_refused_blocks_total")

    # the real spoke x, asked (as a mount would be) for b's blocks y owns
    sizes = dict(b_blocks)
    for digest in (cached[0], uncached[0]):
        with pytest.raises(grpc.RpcError) as refused:
            read_all(x, [(digest, sizes[digest])])
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND  # the hub's answer to x
        assert not CacheLayout(x.cache).block_path(digest).exists()
    assert y.metric("strata_spoke_peer_refused_blocks_total") - declined0 == 2
    # y fetched nothing for x: its own reads of b are all it asked the hub for
    assert y.metric("strata_spoke_source_blocks_total", source="hub") == y_hub_blocks

    async def attack() -> None:
        # with the region's token and certificate, but no grant; then without a token
        bare = Peer(tenants.region, y.node)
        for token, reason in ((True, "no_grant"), (False, "token")):
            before = y.metric("strata_spoke_peer_refusals_total", reason=reason)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await bare.read([(cached[0], sizes[cached[0]])], token=token)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert y.metric("strata_spoke_peer_refusals_total", reason=reason) - before == 1
        await bare.close()
        # with a valid grant of its own for a: b is declined, cached or not; a is served
        keeper = tenants.keeper(tenants.token_a)
        await keeper.fetch()
        tenant = Peer(tenants.region, y.node, keeper)
        a_digest, a_size = a_blocks[0]
        wanted = [(cached[0], 1), (uncached[0], 1), (a_digest, 1)]
        declined, served, announced = await tenant.read(wanted, snapshots=(("b", "v1", "0" * 32),))
        assert sorted(declined) == sorted([cached[0], uncached[0]])
        assert list(served) == [a_digest] and block_digest(served[a_digest]) == a_digest
        assert announced == [a_size]  # its own manifest's size, not the 1 asked
        # a digest y holds for b and one nobody holds look the same to the tenant, in its
        # answer and in y's /metrics (what Prometheus scrapes on the tokenless --metrics port)
        changed = []
        for guess in (cached[1], block_digest(os.urandom(64))):
            before = _series(y)
            declined, served, _ = await tenant.read([(guess, 1)])
            assert declined == [guess] and served == {}
            after = _series(y)
            changed.append({k for k, v in after.items() if before.get(k) != v})
        assert changed[0] == changed[1] and changed[0]
        await tenant.close()

    asyncio.run(attack())
    assert y.metric("strata_spoke_source_blocks_total", source="hub") == y_hub_blocks + 1
    audit = [json.loads(line) for line in (y.cache / "audit.jsonl").read_text().splitlines()]
    outcomes = {r["outcome"] for r in audit if r["what"] == "peer ReadBlocks"}
    assert {"refused: declined", "refused: no_grant", "refused: token"} <= outcomes
    # only the owner-only audit log says which declined blocks were another tenant's
    declines = [r for r in audit if r["outcome"] == "refused: declined"]
    assert any(r["outside"] for r in declines) and any(r["unknown"] for r in declines)


def test_a_narrowed_token_loses_its_datasets_on_peers_within_a_grant_lifetime(
    tenants: Tenants,
) -> None:
    x, y = tenants.x, tenants.y
    a_blocks = manifest_blocks(x, "a")
    assert manifest_blocks(y, "a") == a_blocks
    read_all(y, a_blocks)  # y holds all of a
    mine = _owned_by(y, [x, y], a_blocks)
    sizes = dict(a_blocks)
    from_peers = x.metric("strata_spoke_source_blocks_total", source="peer")
    read_all(x, [(mine[0], sizes[mine[0]])])  # from y, through the mesh
    assert x.metric("strata_spoke_source_blocks_total", source="peer") - from_peers == 1

    async def narrow() -> float:
        keeper = tenants.keeper(tenants.token_a)
        await keeper.fetch()
        peer = Peer(tenants.region, y.node, keeper)
        _, served, _ = await peer.read([(mine[1], sizes[mine[1]])])
        assert list(served) == [mine[1]]
        stale = keeper.metadata(y.node, "ReadBlocks")  # the grant of before, kept
        assert stale
        narrowed = time.monotonic()
        tenants.tokens.write_text(f'"{TOKEN_A}": ["c", "c-*"]\n"{TOKEN_AB}": ["a", "b"]\n')
        assert keeper.grant is not None
        old = keeper.grant.claims
        await keeper.fetch()  # a grant asked for now says what the token says now
        assert keeper.claims is not None and list(keeper.claims.scopes) == ["c", "c-*"]
        # the old grant, shown by a holder who would not let go of it, until y refuses it
        keeper.grant = hub_pb2.ReadGrant.FromString(dict(stale)["strata-grant-bin"])
        assert keeper.grant.claims == old
        keeper._usable_until = float("inf")  # (as a dishonest holder would)

        async def refused() -> float | None:  # seconds since the narrowing, once y refuses
            try:
                await peer.read([(mine[2], sizes[mine[2]])])
            except grpc.aio.AioRpcError as err:
                assert err.code() == grpc.StatusCode.UNAUTHENTICATED
                assert "expired" in (err.details() or "")
                return time.monotonic() - narrowed
            return None

        refused_after = await eventually_async(
            refused, "y refusing the old grant", 20, interval=0.05
        )
        await peer.close()
        return refused_after

    refused_after = asyncio.run(narrow())
    # the old grant was issued before the narrowing: expiry plus the clock skew allowed
    assert refused_after <= LIFETIME_S + SKEW_S + 2.0
    # and the real spoke x: its next grant says c, and y stops serving it a
    wait_until(
        lambda: x.stats()["mesh"]["grant"].get("datasets") == ["c", "c-*"],
        "x's grant follows its narrowed token",
        timeout=LIFETIME_S + 5,
    )
    declined0 = y.metric("strata_spoke_peer_refused_blocks_total")
    with pytest.raises(grpc.RpcError):
        read_all(x, [(mine[3], sizes[mine[3]])])
    assert y.metric("strata_spoke_peer_refused_blocks_total") - declined0 == 1
    assert not CacheLayout(x.cache).block_path(mine[3]).exists()
