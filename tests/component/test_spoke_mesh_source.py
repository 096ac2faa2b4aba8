"""The mesh source and the peer service in one process: the owner fetches once for every
asker, a token is required when set, dead and stalled peers fall back to the hub."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc
import grpc.aio
import pytest

from deploy.local import free_port
from protocol.hub.v1 import hub_pb2
from protocol.spoke.v1 import peer_pb2, peer_pb2_grpc
from spoke.cache import BlockCache
from spoke.fetcher import Fetcher
from spoke.layout import CacheLayout, block_digest
from spoke.mesh.membership import Membership
from spoke.mesh.peerclient import PeerClient, PeerTls
from spoke.mesh.peerservice import PeerService, start_peer_server
from spoke.mesh.rendezvous import owner
from spoke.mesh.source import MeshSource
from spoke.policy import LRUPolicy
from spoke.scheduler import FetchScheduler
from spoke.store import BlockStore, open_index

pytestmark = pytest.mark.timeout(60)


class FakeHub:
    """A BlockSource serving a dict; counts every block it sends."""

    name = "hub:0"

    def __init__(self, blocks: dict[str, bytes], delay: float = 0.0) -> None:
        self.blocks = blocks
        self.sent: list[str] = []
        self.delay = delay

    async def read_blocks(
        self, digests: Sequence[str], timeout: float
    ) -> AsyncIterator[tuple[str, bytes]]:
        await asyncio.sleep(self.delay)
        for d in digests:
            self.sent.append(d)
            yield d, self.blocks[d]


def _blocks(n: int) -> dict[str, bytes]:
    out = {}
    for i in range(n):
        data = f"block {i} ".encode() * 700
        out[block_digest(data)] = data
    return out


def _cache(root: Path) -> BlockCache:
    layout = CacheLayout(root)
    return BlockCache(BlockStore(layout, open_index(layout)), LRUPolicy(1 << 30), 1 << 30)


def _live(membership: Membership, *nodes: str) -> None:
    membership.live = set(nodes)
    membership._publish()


async def _owner(
    root: Path, hub: FakeHub, token: str | None = None
) -> tuple[str, grpc.aio.Server, MeshSource]:
    node = f"127.0.0.1:{free_port()}"
    cache = _cache(root)
    source = MeshSource(hub, Membership(node))
    scheduler = FetchScheduler(Fetcher(source, cache), cache)
    source.request_of = scheduler.request_of
    server, _ = await start_peer_server(
        PeerService(node, cache, scheduler, source, token=token), node
    )
    return node, server, source


def test_the_owner_fetches_each_block_once_for_every_asker(tmp_path: Path) -> None:
    blocks = _blocks(12)

    async def go() -> tuple[list[str], list[int]]:
        owner_hub = FakeHub(blocks, delay=0.05)
        node, server, _ = await _owner(tmp_path / "owner", owner_hub)
        askers = []
        for i in range(3):
            me = f"127.0.0.1:{40000 + i}"
            membership = Membership(me, [node])
            await membership.refresh()
            assert membership.live == {node}
            askers.append((MeshSource(FakeHub(blocks), membership), membership))
        # each asker wants the blocks the owner owns in its view
        wanted = [[d for d in blocks if owner(d, m.nodes) == node] for _, m in askers]

        async def read(source: MeshSource, digests: list[str]) -> int:
            got = {d: b async for d, b in source.read_blocks(digests, 10)}
            assert got == {d: blocks[d] for d in digests}
            return len(got)

        counts = await asyncio.gather(
            *(read(s, w) for (s, _), w in zip(askers, wanted, strict=True))
        )
        for _, m in askers:
            await m.close()
        await server.stop(0)
        return owner_hub.sent, list(counts)

    sent, counts = asyncio.run(go())
    assert all(counts) and len(sent) == len(set(sent))  # one hub fetch per block
    assert CacheLayout(tmp_path / "owner").block_path(sent[0]).is_file()  # the owner keeps it


def test_a_peer_token_is_required_when_set(tmp_path: Path) -> None:
    blocks = _blocks(4)

    async def go() -> tuple[str | None, str | None, str]:
        node, server, _ = await _owner(tmp_path / "owner", FakeHub(blocks), token="s3cret")
        bad = Membership("127.0.0.1:1", [node], connect=lambda n: PeerClient(n, "wrong"))
        good = Membership("127.0.0.1:1", [node], connect=lambda n: PeerClient(n, "s3cret"))
        await bad.refresh()
        await good.refresh()
        refused = bad.errors.get(node)
        raw = grpc.aio.insecure_channel(node)
        try:
            await peer_pb2_grpc.SpokePeerStub(raw).Probe(peer_pb2.ProbeRequest(), timeout=5)
            code = "OK"
        except grpc.aio.AioRpcError as err:
            code = err.code().name
        await raw.close()
        await bad.close()
        await good.close()
        await server.stop(0)
        return refused, good.errors.get(node), code

    refused, ok, code = asyncio.run(go())
    assert refused is not None and "wrong peer token" in refused
    assert ok is None and code == "UNAUTHENTICATED"


class Stall(peer_pb2_grpc.SpokePeerServicer):
    """Answers probes, then never sends a block."""

    def __init__(self, node: str) -> None:
        self.node = node

    async def Probe(self, request: object, context: object) -> peer_pb2.ProbeResponse:
        return peer_pb2.ProbeResponse(node=self.node)

    async def ReadBlocks(
        self, request_iterator: object, context: object
    ) -> AsyncIterator[hub_pb2.BlockChunk]:
        await asyncio.sleep(3600)
        yield hub_pb2.BlockChunk()


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
        membership = Membership(me, [dead, slow])
        await membership.refresh()
        _live(membership, dead, slow)  # as if both had answered the last probe
        hub = FakeHub(blocks)
        source = MeshSource(hub, membership, step_timeout=0.5)
        got = {d: b async for d, b in source.read_blocks(list(blocks), 30)}
        await membership.close()
        await server.stop(0)
        return got, hub, membership

    got, hub, membership = asyncio.run(go())
    assert got == blocks
    assert sorted(hub.sent) == sorted(blocks)  # every block, once, from the hub
    assert membership.nodes == ("127.0.0.1:2",)  # both peers left, their share re-hashed


def _pki(root: Path) -> tuple[Path, PeerTls, PeerTls]:
    """A CA, a spoke certificate it signed (server and client use, for 127.0.0.1), and
    one from a CA nobody trusts."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def write(stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Path:
        (root / f"{stem}.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        path = root / f"{stem}.crt"
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return path

    def authority(cn: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(name(cn))
            .issuer_name(name(cn))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256())
        )
        return cert, key

    def leaf(stem: str, ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey]) -> PeerTls:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(name(stem))
            .issuer_name(ca[0].subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False,
            )
            .sign(ca[1], hashes.SHA256())
        )
        return PeerTls(write(stem, cert, key), root / f"{stem}.key", ca_path)

    ca = authority("region-ca")
    ca_path = write("region-ca", *ca)
    return ca_path, leaf("spoke", ca), leaf("intruder", authority("foreign-ca"))


def test_mtls_admits_the_region_and_refuses_a_foreign_certificate(tmp_path: Path) -> None:
    blocks = _blocks(4)
    _, tls, intruder = _pki(tmp_path)

    async def go() -> tuple[dict[str, bytes], str | None]:
        node = f"127.0.0.1:{free_port()}"
        cache = _cache(tmp_path / "owner")
        source = MeshSource(FakeHub(blocks), Membership(node))
        scheduler = FetchScheduler(Fetcher(source, cache), cache)
        source.request_of = scheduler.request_of
        server, _ = await start_peer_server(PeerService(node, cache, scheduler, source), node, tls)
        good = Membership("127.0.0.1:1", [node], connect=lambda n: PeerClient(n, None, tls))
        bad = Membership("127.0.0.1:1", [node], connect=lambda n: PeerClient(n, None, intruder))
        await good.refresh()
        await bad.refresh()
        client = good.client(node)
        got = {d: b async for d, b in client.read_blocks([(d, 0) for d in blocks], "demand", 10, 5)}
        refused = None if node in bad.live else bad.errors.get(node)
        await good.close()
        await bad.close()
        await server.stop(0)
        return got, refused

    got, refused = asyncio.run(go())
    assert got == blocks
    assert refused is not None
