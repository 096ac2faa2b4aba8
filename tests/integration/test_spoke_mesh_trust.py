"""The mesh's trust on 127.0.0.1, through real daemons: two tenants behind one TLS hub with
tokens, a spoke scoped to ``a`` cannot get ``b``'s blocks from its peer (cached there or
not, with the region token, without one, with a grant of its own), and loses ``a`` on its
peers within a grant's lifetime once its token is narrowed; an owner asked for unknown
digests, with made-up sizes and classes, queues nothing of it."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio
import httpx
import pytest

from deploy.pki import LocalCa
from protocol.hub.v1 import hub_pb2
from protocol.spoke.v1 import peer_pb2, peer_pb2_grpc
from spoke.disk.layout import CacheLayout, block_digest
from spoke.hublink.client import HubClient
from spoke.hublink.credentials import HubCredentials
from spoke.mesh.grantcheck import SKEW_S
from spoke.mesh.grants import GrantKeeper
from spoke.mesh.peerclient import declined_digests, read_blocks_call
from spoke.mesh.rendezvous import owner
from spoke.mesh.transport import PeerTls, PeerToken
from tests.integration.mesh_support import (
    BLOCK,
    Region,
    Spoke,
    manifest_blocks,
    read_all,
    wait_until,
)
from tests.integration.partial_bodies import PartialRequests
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
    """One region for the two tenant tests, the file's last (so that it stops as they end,
    not after the others): the first only reads (its counts are deltas); the second,
    which narrows ``x``'s token for good, runs after it."""
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


class Peer:
    """Raw calls to a spoke's peer port, as any program holding the region's credentials
    (and, given a keeper, a grant of its own) could make them."""

    def __init__(self, region: Region, node: str, keeper: GrantKeeper | None = None) -> None:
        self.node = node
        self.keeper = keeper
        tls = PeerTls(
            region.flag("--peer-cert"), region.flag("--peer-key"), region.flag("--peer-ca")
        )
        self.token = PeerToken(region.flag("--peer-token-file"))
        self.channel = grpc.aio.secure_channel(node, tls.channel_credentials())
        self.stub = peer_pb2_grpc.SpokePeerStub(self.channel)

    async def read(
        self,
        blocks: list[tuple[str, int]],
        request_class: str = "demand",
        token: bool = True,
        grant: bool = True,
        snapshots: tuple[tuple[str, str, str], ...] = (),
    ) -> tuple[list[str], dict[str, bytes], list[int]]:
        """Declined digests, blocks served, and each block's announced size.

        Raises:
            grpc.aio.AioRpcError: the call was refused.
        """
        metadata: tuple[tuple[str, str | bytes], ...] = self.token.metadata() if token else ()
        if grant and self.keeper is not None:
            metadata += self.keeper.metadata(self.node, "ReadBlocks")
        request = peer_pb2.PeerReadRequest(
            blocks=[hub_pb2.BlockRef(digest=d, size=s) for d, s in blocks],
            request_class=request_class,
            snapshots=[
                peer_pb2.SnapshotRef(dataset=d, version=v, snapshot_id=i) for d, v, i in snapshots
            ],
        )
        call = read_blocks_call(self.channel)(request, timeout=60, metadata=metadata)
        declined = declined_digests(await call.initial_metadata())
        served: dict[str, bytes] = {}
        sizes = []
        async for chunk in call:
            served[chunk.digest] = served.get(chunk.digest, b"") + chunk.data
            if chunk.last:
                sizes.append(chunk.block_size)
        if not declined and not served:  # all declined: repeated in the trailers
            declined = declined_digests(await call.trailing_metadata())
        return declined, served, sizes

    async def close(self) -> None:
        await self.channel.close()
        if self.keeper is not None:
            await self.keeper.hub.close()


def _series(spoke: Spoke) -> dict[str, float]:
    """The peer refusal series of a spoke's /metrics (no token needed), by name and labels."""
    text = httpx.get(f"{spoke.admin}/metrics", timeout=10).text
    lines = (line.rpartition(" ") for line in text.splitlines() if not line.startswith("#"))
    return {k: float(v) for k, _, v in lines if k.startswith("strata_spoke_peer_refus")}


def _owned_by(spoke: Spoke, nodes: list[Spoke], blocks: list[tuple[str, int]]) -> list[str]:
    return [d for d, _ in blocks if owner(d, [s.node for s in nodes]) == spoke.node]


@pytest.fixture
def region(tmp_path: Path) -> Iterator[Region]:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(4):
        (src / f"f{i}.bin").write_bytes(os.urandom(2 * BLOCK))
    assert publish(tmp_path / "hub", "ds", src, "--block-size", str(BLOCK)) == "v1"
    r = Region(tmp_path)
    try:
        r.start_hub()
        yield r
    finally:
        r.close()


def test_unknown_digests_and_made_up_sizes_or_classes_queue_nothing(region: Region) -> None:
    y = region.add("y")
    region.start(y)
    region.wait_live([y], 1)
    blocks = manifest_blocks(y)
    classes = ("demand", "peer", "hint", "readahead", "prewarm", "fill")

    def fetched() -> dict[str, float]:
        return {c: y.metric("strata_spoke_fetch_bytes_total", **{"class": c}) for c in classes}

    before, served_before = fetched(), region.hub_metric("strata_hub_blocks_served_total")
    unknown0 = y.metric("strata_spoke_peer_refused_blocks_total")
    huge = 0xFFFFFFFF  # the largest size a BlockRef holds: 256 of them ask for 1 TiB
    bogus = [(block_digest(os.urandom(64)), huge) for _ in range(256)]

    async def ask() -> tuple[list[str], dict[str, bytes], list[int], grpc.StatusCode]:
        keeper = GrantKeeper(HubClient(region.wan.address), "127.0.0.1:9")
        await keeper.fetch()
        peer = Peer(region, y.node, keeper)
        declined, served, _ = await peer.read(bogus, request_class="demand")
        assert sorted(declined) == sorted(d for d, _ in bogus) and served == {}
        digest, size = blocks[0]
        declined, served, announced = await peer.read([(digest, huge)], request_class="demand")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await peer.read([*bogus, (digest, size)])
        await peer.close()
        return declined, served, announced, err.value.code()

    declined, served, announced, too_many = asyncio.run(ask())
    digest, size = blocks[0]
    assert declined == [] and list(served) == [digest] and announced == [size]
    assert block_digest(served[digest]) == digest
    assert too_many == grpc.StatusCode.INVALID_ARGUMENT  # 257 blocks
    after = fetched()
    # exactly the one real block was fetched, at its real size, in the peer class
    assert {c: after[c] - before[c] for c in classes} == {
        "demand": 0,
        "peer": size,
        "hint": 0,
        "readahead": 0,
        "prewarm": 0,
        "fill": 0,
    }
    assert region.hub_metric("strata_hub_blocks_served_total") - served_before == 1
    assert y.metric("strata_spoke_peer_refused_blocks_total") - unknown0 == 256
    assert y.metric("strata_spoke_fetch_queued_bytes") == 0
    assert y.stats()["fetch"]["queued"]["peer"] == {"blocks": 0, "bytes": 0}


@pytest.mark.timing
def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def test_a_refused_call_reads_none_of_its_request(region: Region) -> None:
    """Calls without the region's token, or with it and no grant, are refused before any
    request byte is asked for, the unary Probe as ReadBlocks: gRPC core holds at most each
    stream's first window for them, and drops it as the call ends. A request declared over
    the port's 64 KiB limit is refused as its length arrives. (The probe: a region
    certificate without a token had 5.1 GiB accepted in 20 s and took the daemon from 95
    to 731 MiB.)"""
    y = region.add("y")
    region.start(y)
    region.wait_live([y], 1)
    assert y.proc is not None
    host, _, port = y.node.rpartition(":")
    tls = ssl.create_default_context(cafile=str(region.flag("--peer-ca")))
    tls.check_hostname = False
    tls.load_cert_chain(str(region.flag("--peer-cert")), str(region.flag("--peer-key")))
    token = PeerToken(region.flag("--peer-token-file")).metadata()
    path = "/protocol.spoke.v1.SpokePeer/ReadBlocks"
    before = {
        r: y.metric("strata_spoke_peer_refusals_total", reason=r) for r in ("token", "no_grant")
    }
    rest_kib = _rss_kib(y.proc.pid)
    peak_kib = rest_kib
    callers = []
    try:
        for metadata in ((), tuple((k, str(v)) for k, v in token)):
            for declared in (60 << 10, 8 << 20):  # within the port's limit, and over it
                caller = PartialRequests(host, int(port), tls)
                caller.open(path, declared, metadata, count=100)
                callers.append(caller)
        # Probe, the unary call, without a token: admitted by its headers too (probedoor;
        # the fifth probe held 64 KiB on each of 256 x 128 such streams: 68 -> 2,816 MiB)
        caller = PartialRequests(host, int(port), tls)
        caller.open("/protocol.spoke.v1.SpokePeer/Probe", 60 << 10, (), count=100)
        callers.append(caller)
        started = time.monotonic()
        while any(c.open_streams() for c in callers):
            assert time.monotonic() - started < 10, "refused calls left open"
            for caller in callers:
                caller.pump(0.05)
            peak_kib = max(peak_kib, _rss_kib(y.proc.pid))
    finally:
        for caller in callers:
            caller.close()
    streams = [s for c in callers for s in c.streams.values()]
    assert {s.status for s in streams} == {str(grpc.StatusCode.UNAUTHENTICATED.value[0])}
    assert max(s.sent for s in streams) <= 65_535  # one window: never more was taken
    assert sum(s.sent for s in streams) < 500 * 65_535
    refused = {"token": 300, "no_grant": 200}  # Probe asks for no grant
    for reason in before:
        got = y.metric("strata_spoke_peer_refusals_total", reason=reason) - before[reason]
        assert got == refused[reason], (reason, got)
    taken = sum(s.sent for s in streams)
    print(f"peer port: {len(streams)} refused calls took {taken >> 10} KiB of requests; daemon")
    print(f"  {rest_kib >> 10} -> {peak_kib >> 10} MiB at the peak")
    assert (peak_kib - rest_kib) >> 10 < 64, f"{rest_kib >> 10} -> {peak_kib >> 10} MiB"
    # a caller that sends its request with the call's headers, as spokes do, reads the status
    digest, size = manifest_blocks(y)[0]

    async def refused() -> grpc.StatusCode:
        bare = Peer(region, y.node)
        try:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await bare.read([(digest, size)], token=False)
            return err.value.code()
        finally:
            await bare.close()

    assert asyncio.run(refused()) == grpc.StatusCode.UNAUTHENTICATED


def test_a_peer_port_without_tls_or_token_warns_at_start(region: Region, tmp_path: Path) -> None:
    cache = tmp_path / "plain"
    node = "127.0.0.1:0"
    cmd = [sys.executable, "-m", "spoke", "daemon", "--hub", region.wan.address]
    cmd += ["--cache-dir", str(cache), "--cache-size", "64MiB", "--admin", "127.0.0.1:0"]
    cmd += ["--peer-listen", node, "--peer-advertise", "127.0.0.1:1", "--peer-insecure"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_until(
            lambda: (cache / "admin.url").exists() or proc.poll() is not None, "daemon started"
        )
        assert proc.poll() is None
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    (line,) = [x for x in err.splitlines() if "--peer-insecure" in x]
    assert " WARNING " in line and "plaintext, no region token" in line


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
        # answer and in y's /metrics (open to anyone who reaches the admin port)
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
