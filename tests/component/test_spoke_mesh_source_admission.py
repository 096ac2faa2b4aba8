"""Who the peer port lets in, with the mesh source and the peer service in one process: a
peer token is required (and rotates with a grace), a caller over its limits is sent to the
hub and the peer stays in the mesh, mTLS admits the region and refuses a foreign
certificate, and Probe calls are counted until done and capped (in all, and per host).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import grpc.aio
import pytest

from deploy.pki import LocalCa
from protocol.spoke.v1 import peer_pb2, peer_pb2_grpc
from spoke.fetch.scheduler import Priority
from spoke.mesh import metrics
from spoke.mesh.admission import CallerLimits
from spoke.mesh.membership import Membership
from spoke.mesh.peerclient import PeerClient
from spoke.mesh.peerservice import (
    PROBE_CALLS,
    PROBE_CALLS_PER_HOST,
)
from spoke.mesh.transport import PeerTls, PeerToken
from tests.component.mesh_source_support import (
    FakeHub,
    Owner,
    _asker,
    _blocks,
    _keeper,
    _sample,
    _sized,
)
from tests.support import eventually_async

pytestmark = pytest.mark.timeout(60)


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
