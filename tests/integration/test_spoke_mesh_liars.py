"""A peer that lies about a block's length cannot hurt the spoke asking it, on 127.0.0.1:
a flood of 4 MiB chunks never marked last for a 300,000-byte block, an answer longer than
the block, one shorter, one announcing another size. Each is cut off at once (counted as
lying, the peer quarantined), the block still arrives from the hub with the right bytes,
and the victim daemon's memory stays bounded. A peer trickling valid one-byte chunks, each
well within ``--peer-timeout``, is cut off once it falls behind the pace, quarantined, and
the read completes from the hub within one miss deadline."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bench.liars import Liar, memory
from protocol.hub.v1 import hub_pb2
from protocol.spoke.v1 import peer_pb2, peer_pb2_grpc
from spoke.disk.layout import block_digest
from spoke.mesh.rendezvous import owner
from tests.integration.mesh_support import Region, manifest_blocks, read_all
from tests.support import publish

pytestmark = pytest.mark.timeout(240)

SIZE = 300_000
RSS_BOUND = 512 << 20
MISS_DEADLINE_S = 60.0  # the region's spokes' --miss-deadline
STEP_S = 2.0  # the victim's --peer-timeout
TRICKLE_S = 1.5  # between two one-byte chunks: within STEP_S, far below the pace


@pytest.mark.parametrize("how", ["flood", "longer", "shorter", "other size"])
def test_a_peer_lying_about_a_blocks_length_is_cut_off(tmp_path: Path, how: str) -> None:
    region = Region(tmp_path)
    try:
        victim, fake = region.add("victim"), region.add("liar")
        nodes = [victim.node, fake.node]
        src = tmp_path / "src"
        src.mkdir()
        while True:  # a one-block file the liar owns
            data = os.urandom(SIZE)
            if owner(block_digest(data), nodes) == fake.node:
                break
        (src / "one.bin").write_bytes(data)
        assert publish(tmp_path / "hub", "ds", src, "--block-size", str(4 << 20)) == "v1"
        region.start_hub()
        liar = Liar(fake.node, how)
        with region.fake_peer(liar, fake.node):
            region.start(victim, peers=[victim, fake])
            region.wait_live([victim], 2)
            assert victim.proc is not None
            blocks = manifest_blocks(victim)
            assert blocks == [(block_digest(data), SIZE)]
            assert read_all(victim, blocks) == SIZE  # the right bytes, from the hub
            rss, peak = memory(victim.proc.pid)
            assert liar.sent > 0  # it was asked, and answered
            assert victim.metric("strata_spoke_peer_errors_total", kind="lying") == 1
            assert victim.stats()["mesh"]["peers"][fake.node]["live"] is False  # quarantined
            assert victim.metric("strata_spoke_source_bytes_total", source="hub") == SIZE
            assert victim.metric("strata_spoke_source_bytes_total", source="peer") == 0
        assert peak < RSS_BOUND and rss < RSS_BOUND, (rss, peak)
    finally:
        region.close()


class Trickler(peer_pb2_grpc.SpokePeerServicer):
    """Answers probes as ``node`` and every block request with valid one-byte chunks, one
    every :data:`TRICKLE_S` (each within the asker's step timeout)."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.asked = 0

    async def Probe(self, request: object, context: object) -> peer_pb2.ProbeResponse:
        return peer_pb2.ProbeResponse(node=self.node)

    async def ReadBlocks(
        self, request_iterator: AsyncIterator[peer_pb2.PeerReadRequest], context: object
    ) -> AsyncIterator[hub_pb2.BlockChunk]:
        async for request in request_iterator:
            self.asked += 1
            for block in request.blocks:
                for offset in range(block.size):
                    yield hub_pb2.BlockChunk(
                        digest=block.digest,
                        offset=offset,
                        data=b"\0",
                        block_size=block.size,
                        last=offset == block.size - 1,
                    )
                    await asyncio.sleep(TRICKLE_S)


def test_a_trickling_peer_is_cut_off_at_its_pace_and_quarantined(tmp_path: Path) -> None:
    region = Region(tmp_path)
    try:
        victim = region.add("victim", ("--peer-timeout", str(STEP_S)))
        fake = region.add("trickler")
        nodes = [victim.node, fake.node]
        src = tmp_path / "src"
        src.mkdir()
        for name in ("one.bin", "two.bin"):  # two one-block files the trickler owns
            while owner(block_digest(data := os.urandom(SIZE)), nodes) != fake.node:
                pass
            (src / name).write_bytes(data)
        assert publish(tmp_path / "hub", "ds", src, "--block-size", str(4 << 20)) == "v1"
        region.start_hub()
        trickler = Trickler(fake.node)
        with region.fake_peer(trickler, fake.node):
            region.start(victim, peers=[victim, fake])
            region.wait_live([victim], 2)
            first, second = manifest_blocks(victim)
            started = time.monotonic()
            assert read_all(victim, [first]) == SIZE  # the right bytes, from the hub
            took = time.monotonic() - started
            assert trickler.asked == 1
            assert victim.metric("strata_spoke_peer_errors_total", kind="slow") == 1
            assert victim.metric("strata_spoke_peer_quarantines_total", kind="slow") == 1
            assert victim.stats()["mesh"]["peers"][fake.node]["live"] is False
            # quarantined, so not asked again: the next block it owns comes from the hub
            assert read_all(victim, [second]) == SIZE
            assert trickler.asked == 1
            assert victim.metric("strata_spoke_source_bytes_total", source="hub") == 2 * SIZE
            assert victim.metric("strata_spoke_source_bytes_total", source="peer") == 0
        # the pace (STEP_S + SIZE at 1 MiB/s) cut it, long before the read's own deadline
        # (it used to wait the whole miss deadline, then asked the hub with a fresh one)
        assert took < MISS_DEADLINE_S, took
    finally:
        region.close()
