"""The peer port's own defences on 127.0.0.1, through real daemons: an owner asked for
unknown digests, with made-up sizes and classes, queues nothing of it; a refused call
(no token, or no grant) reads none of its request, whatever it declares; a peer port
without TLS or token warns at start. Trust between tenants is in
``test_spoke_mesh_trust.py``."""

from __future__ import annotations

import asyncio
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from spoke.disk.layout import block_digest
from spoke.hublink.client import HubClient
from spoke.mesh.grants import GrantKeeper
from spoke.mesh.transport import PeerToken
from tests.integration.mesh_support import (
    BLOCK,
    Region,
    manifest_blocks,
    wait_until,
)
from tests.integration.mesh_trust_support import Peer
from tests.integration.partial_bodies import PartialRequests
from tests.support import publish

pytestmark = pytest.mark.timeout(240)


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
