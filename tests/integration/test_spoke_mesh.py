"""The regional mesh on 127.0.0.1: three spokes and a hub behind the WAN emulator.

Each block crosses the WAN once for the whole region; a peer killed and restarted, a peer
that lies, and a peer joining mid-read never fail a read nor deliver a wrong byte.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.liars import Liar
from deploy.local import free_port
from tests.integration.mesh_support import BLOCK, Region, manifest_blocks, read_all
from tests.support import publish

pytestmark = pytest.mark.timeout(240)

FILES = 6
FILE_BYTES = 10 * BLOCK + 4321  # 11 blocks each: 66 blocks, ~4 MiB


@pytest.fixture
def region(tmp_path: Path) -> Iterator[Region]:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(FILES):
        (src / f"f{i}.bin").write_bytes(os.urandom(FILE_BYTES))
    assert publish(tmp_path / "hub", "ds", src, "--block-size", str(BLOCK)) == "v1"
    r = Region(tmp_path)
    try:
        r.start_hub()
        yield r
    finally:
        r.close()


def _parallel(jobs: dict[str, object]) -> dict[str, object]:
    """Run each callable on a thread of its own; re-raise the first failure."""
    results: dict[str, object] = {}
    errors: list[BaseException] = []

    def run(name: str, job: object) -> None:
        try:
            results[name] = job()  # type: ignore[operator]
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=run, args=item) for item in jobs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def test_three_spokes_read_everything_and_each_block_crosses_the_wan_once(
    region: Region,
) -> None:
    spokes = [region.add(name) for name in ("a", "b", "c")]
    for spoke in spokes:
        region.start(spoke)
    region.wait_live(spokes, 3)
    blocks = manifest_blocks(spokes[0])
    for spoke in spokes[1:]:  # each reader has the snapshot, as a mount would
        assert manifest_blocks(spoke) == blocks
    dataset = sum(size for _, size in blocks)
    before = region.wan.stats().down_bytes
    checked = _parallel({s.name: (lambda s=s: read_all(s, blocks)) for s in spokes})
    assert checked == {s.name: dataset for s in spokes}
    assert region.hub_metric("strata_hub_blocks_served_total") == len(blocks)
    assert region.wan.stats().down_bytes - before <= 1.05 * dataset
    peer_bytes = sum(s.metric("strata_spoke_source_bytes_total", source="peer") for s in spokes)
    hub_bytes = sum(s.metric("strata_spoke_source_bytes_total", source="hub") for s in spokes)
    assert hub_bytes == dataset and peer_bytes == 2 * dataset
    mesh = spokes[0].stats()["mesh"]
    assert mesh["nodes_live"] == 3 and mesh["owned_share"] == pytest.approx(1 / 3, abs=1e-3)
    assert mesh["sources"]["peer"]["bytes"] + mesh["sources"]["hub"]["bytes"] == dataset


def test_over_the_bulk_peer_port_each_block_crosses_the_wan_once(region: Region) -> None:
    """As the first test, with ``--peer-bulk-port``: every spoke serves its peers on the
    same bulk port (each on a loopback address of its own, one region certificate named
    ``localhost``), under mTLS with the region token; the WAN still carries each block
    once (1.00x) and the peers' bytes all take the bulk channel."""
    flags = ("--peer-bulk-port", str(free_port()), "--peer-server-name", "localhost")
    spokes = [region.add(name, flags, f"127.0.0.{i}") for i, name in enumerate("abc", 2)]
    for spoke in spokes:
        region.start(spoke)
    region.wait_live(spokes, 3)
    blocks = manifest_blocks(spokes[0])
    for spoke in spokes[1:]:
        assert manifest_blocks(spoke) == blocks
    dataset = sum(size for _, size in blocks)
    before = region.wan.stats().down_bytes
    checked = _parallel({s.name: (lambda s=s: read_all(s, blocks)) for s in spokes})
    assert checked == {s.name: dataset for s in spokes}
    assert region.hub_metric("strata_hub_blocks_served_total") == len(blocks)
    wan = region.wan.stats().down_bytes - before
    assert wan <= 1.05 * dataset
    peer_bytes = sum(s.metric("strata_spoke_source_bytes_total", source="peer") for s in spokes)
    hub_bytes = sum(s.metric("strata_spoke_source_bytes_total", source="hub") for s in spokes)
    assert hub_bytes == dataset and peer_bytes == 2 * dataset
    bulk_bytes = sum(s.metric("strata_spoke_peer_bulk_bytes_total") for s in spokes)
    assert bulk_bytes == peer_bytes  # none over the peer port's gRPC
    print(f"WAN bytes {wan / dataset:.2f}x the dataset, peers over bulk {bulk_bytes:,.0f} B")


def test_a_peer_killed_mid_read_and_restarted(region: Region) -> None:
    spokes = [region.add(name) for name in ("a", "b", "c")]
    for spoke in spokes:
        region.start(spoke)
    region.wait_live(spokes, 3)
    a, b, c = spokes
    blocks = manifest_blocks(a)
    assert manifest_blocks(c) == blocks
    dataset = sum(size for _, size in blocks)
    half = len(blocks) // 2
    read_all(a, blocks[:half])  # b now owns (and holds) part of the first half
    region.kill(b)
    # a and c read everything: b's share goes to the hub or to its next owner
    checked = _parallel({s.name: (lambda s=s: read_all(s, blocks)) for s in (a, c)})
    assert checked == {"a": dataset, "c": dataset}
    region.start(b)
    region.wait_live(spokes, 3)
    assert read_all(b, blocks) == dataset
    # the WAN carried each block at most twice (once more for what only b had)
    assert region.hub_metric("strata_hub_blocks_served_total") <= 2 * len(blocks)


def test_a_lying_peer_never_delivers_a_wrong_byte(region: Region) -> None:
    fake = region.add("liar")  # never started: the double below answers on its port
    a = region.add("a")
    liar = Liar(fake.node, "flipped", region.wan.address)
    with region.fake_peer(liar, fake.node):
        region.start(a, peers=[a, fake])
        region.wait_live([a], 2)
        blocks = manifest_blocks(a)
        dataset = sum(size for _, size in blocks)
        assert read_all(a, blocks) == dataset  # every byte verified on the way in
        corrupt = a.metric("strata_spoke_peer_corrupt_blocks_total")
        # every block read from the liar is counted; one bad block ends its stream, so
        # blocks it had sent behind that one are dropped unread
        assert 1 <= corrupt <= liar.blocks
        assert a.metric("strata_spoke_peer_errors_total", kind="corrupt") == corrupt
        assert a.stats()["mesh"]["peers"][fake.node]["live"] is False  # quarantined
        assert a.metric("strata_spoke_source_bytes_total", source="hub") == dataset
        assert a.metric("strata_spoke_source_bytes_total", source="peer") == 0


def test_a_spoke_joining_during_a_read(region: Region) -> None:
    spokes = [region.add(name) for name in ("a", "b", "c")]
    a, b, c = spokes
    region.start(a)
    region.start(b)
    region.wait_live([a, b], 2)
    blocks = manifest_blocks(a)
    dataset = sum(size for _, size in blocks)
    third = len(blocks) // 3
    read_all(a, blocks[:third])
    region.start(c)  # c joins: its share moves to it, nobody else's
    assert manifest_blocks(b) == manifest_blocks(c) == blocks
    checked = _parallel(
        {
            "a": lambda: read_all(a, blocks),
            "b": lambda: read_all(b, blocks),
            "c": lambda: read_all(c, blocks),
        }
    )
    assert checked == {"a": dataset, "b": dataset, "c": dataset}
    region.wait_live(spokes, 3)
    assert region.hub_metric("strata_hub_blocks_served_total") <= 2 * len(blocks)
