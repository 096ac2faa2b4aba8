"""The hub's ReadBlocks on loopback, a real grpc.aio server and a blocking client: every
file reassembled from its blocks, requests answered in order, big blocks in growing
chunks, small ones packed when asked, many streams at once, bad and unknown digests
refused without harm to the service, and requests and bytes counted."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from hub.serve.metrics import HubMetrics
from hub.snapshot.blocks import MiB, block_digest
from protocol.hub.v1 import hub_pb2
from tests.integration.hub_service_support import (
    BIG_BLOCK,
    BLOCK,
    RPC_TIMEOUT,
    Hub,
    hub_fixture,  # noqa: F401  (the hub fixture)
    metrics_fixture,  # noqa: F401  (the metrics fixture)
    reassemble,
)


def test_read_blocks_reassembles_every_file(hub: Hub) -> None:
    for entry in hub.manifest():
        if entry.type == hub_pb2.ENTRY_TYPE_FILE:
            assert reassemble(hub, entry) == hub.files[entry.path], entry.path


def test_read_blocks_answers_each_request_in_order(hub: Hub) -> None:
    entry = {e.path: e for e in hub.manifest()}["volume/data.bin"]
    digests = [b.digest for b in entry.blocks]
    chunks = hub.read_blocks(digests[:2], [digests[5], digests[0]], [])
    assert [c.digest for c in chunks] == [digests[0], digests[1], digests[5], digests[0]]
    assert all(c.last and c.offset == 0 for c in chunks)


def test_big_blocks_come_in_chunks_of_at_most_1_mib_growing_from_64_kib(hub: Hub) -> None:
    request = hub_pb2.GetManifestRequest(dataset="big", ref="latest")
    (entry,) = list(hub.stub.GetManifest(request, timeout=RPC_TIMEOUT))
    first = entry.blocks[0]
    chunks = hub.read_blocks([first.digest])
    # a stream's first message is 64 KiB, each next twice the last (hub.serve.blockstream's
    # MessageRamp: a client that never reads stalls on 64 KiB), up to 1 MiB
    KiB = 1024
    assert [(c.offset, len(c.data), c.last) for c in chunks] == [
        (0, 64 * KiB, False),
        (64 * KiB, 128 * KiB, False),
        (192 * KiB, 256 * KiB, False),
        (448 * KiB, 512 * KiB, False),
        (960 * KiB, MiB, False),
        (1984 * KiB, MiB, False),
        (3008 * KiB, 64 * KiB, True),
    ]
    assert all(c.block_size == BIG_BLOCK for c in chunks)
    assert reassemble(hub, entry) == (hub.data.parent / "big" / "block.bin").read_bytes()


def test_small_blocks_come_packed_when_asked(hub: Hub, metrics: HubMetrics) -> None:
    entry = {e.path: e for e in hub.manifest()}["volume/data.bin"]
    digests = [b.digest for b in entry.blocks]  # five 1000-byte blocks and a 123-byte one
    served = metrics.registry.get_sample_value("strata_hub_blocks_served_total") or 0.0
    request = hub_pb2.ReadBlocksRequest(digests=[*digests, digests[0]], pack_bytes=2500)
    messages = list(hub.stub.ReadBlocks(iter([request]), timeout=RPC_TIMEOUT))
    runs = [[m.digest, *(more.digest for more in m.more)] for m in messages]
    # at most 2500 data bytes a message: 2 + 2 + (1000 + 123 + 1000)
    assert runs == [digests[0:2], digests[2:4], [*digests[4:6], digests[0]]]
    chunks = [c for m in messages for c in (m, *m.more)]
    assert all(c.offset == 0 and c.last for c in chunks)
    assert all(not more.more for m in messages for more in m.more)
    data = b"".join(c.data for c in chunks)
    assert data == hub.files["volume/data.bin"] + hub.files["volume/data.bin"][:BLOCK]
    after = metrics.registry.get_sample_value("strata_hub_blocks_served_total")
    assert after == served + 7


def test_packing_leaves_big_blocks_in_chunks_and_stops_at_an_unknown_block(hub: Hub) -> None:
    (big,) = list(hub.stub.GetManifest(hub_pb2.GetManifestRequest(dataset="big", ref="latest")))
    small = {e.path: e for e in hub.manifest()}["volume/data.bin"].blocks
    request = hub_pb2.ReadBlocksRequest(
        digests=[small[0].digest, big.blocks[0].digest, small[1].digest], pack_bytes=MiB
    )
    messages = list(hub.stub.ReadBlocks(iter([request]), timeout=RPC_TIMEOUT))
    KiB = 1024
    # the big block's chunks go on growing from where the first message left the ramp
    assert [(m.digest, m.offset, len(m.more)) for m in messages] == [
        (small[0].digest, 0, 0),
        *((big.blocks[0].digest, at * KiB, 0) for at in (0, 128, 384, 896, 1920, 2944)),
        (small[1].digest, 0, 0),
    ]
    unknown = "0" * 32
    request = hub_pb2.ReadBlocksRequest(
        digests=[small[0].digest, small[1].digest, unknown], pack_bytes=MiB
    )
    call = hub.stub.ReadBlocks(iter([request]), timeout=RPC_TIMEOUT)
    got = []
    with pytest.raises(grpc.RpcError) as info:
        for message in call:
            got += [message.digest, *(m.digest for m in message.more)]
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert got == [small[0].digest, small[1].digest]  # what came before it still arrives


def test_concurrent_streams(hub: Hub) -> None:
    files = [e for e in hub.manifest() if e.type == hub_pb2.ENTRY_TYPE_FILE]
    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(lambda e: reassemble(hub, e), files * 8))
    assert results == [hub.files[e.path] for e in files * 8]


def test_malformed_digest_is_invalid_argument(hub: Hub) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        hub.read_blocks(["../../../etc/passwd"])
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed block digest" in caught.value.details()


def test_unknown_digest_is_not_found(hub: Hub) -> None:
    unknown = block_digest(b"not in the store")
    with pytest.raises(grpc.RpcError) as caught:
        hub.read_blocks([unknown])
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert unknown in caught.value.details()


def test_service_survives_errors(hub: Hub) -> None:
    with pytest.raises(grpc.RpcError):
        hub.read_blocks(["bad"])
    assert hub.stub.ListDatasets(hub_pb2.ListDatasetsRequest(), timeout=RPC_TIMEOUT).datasets


def test_requests_are_counted(hub: Hub, metrics: HubMetrics) -> None:
    def sample(method: str, code: str) -> float:
        value = metrics.registry.get_sample_value(
            "strata_hub_requests_total", {"method": method, "code": code}
        )
        return value or 0.0

    before_ok = sample("ResolveRef", "OK")
    before_nf = sample("ResolveRef", "NOT_FOUND")
    served_before = metrics.registry.get_sample_value("strata_hub_blocks_served_bytes_total") or 0.0
    hub.stub.ResolveRef(hub_pb2.ResolveRefRequest(dataset="f3", ref="v1"), timeout=RPC_TIMEOUT)
    with pytest.raises(grpc.RpcError):
        hub.stub.ResolveRef(hub_pb2.ResolveRefRequest(dataset="f3", ref="v7"), timeout=RPC_TIMEOUT)
    assert sample("ResolveRef", "OK") == before_ok + 1
    assert sample("ResolveRef", "NOT_FOUND") == before_nf + 1
    entry = {e.path: e for e in hub.manifest()}["volume/data.bin"]
    reassemble(hub, entry)
    served = metrics.registry.get_sample_value("strata_hub_blocks_served_bytes_total")
    assert served == served_before + entry.size
