"""Tenants' link shares (spoke.fetch.linkshare) are of the link's rate as well as its
window: on a short round trip the window's floor is many times the link's
bandwidth-delay product, and a share of it no limit (issue 39's eighteenth probe: a
prewarm at link_share 0.2 ran at the loopback's full rate while another tenant's misses
waited p50 0.36 s). The rate is the highest measured lately, kept while shares hold."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from spoke.cache.tenants import TenantShares
from spoke.fetch.life import BlockLives
from spoke.fetch.linkshare import RATE_FLOOR_BPS, REFERENCE_HALF_LIFE_S, LinkShares
from spoke.fetch.priority import Priority
from spoke.fetch.window import LinkWindow

BLOCK = 64 << 10
RATE = 200e6  # bytes/s, measured before anything is held (above RATE_FLOOR_BPS)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _deliver(window: LinkWindow, clock: Clock, rate: float, seconds: float) -> None:
    """Blocks arriving at ``rate`` bytes/s for ``seconds``."""
    step = BLOCK / rate
    for _ in range(int(seconds / step)):
        clock.now += step
        window.on_delivered(BLOCK)


class World:
    """team-a prewarms (``share``), team-b misses; the window is its 8 MiB floor."""

    def __init__(self, tmp_path: Path, share: float, rate: float = RATE) -> None:
        path = tmp_path / "tenants.yaml"
        path.write_text(
            f"team-a: {{datasets: [a], link_share: {share}}}\n"
            "team-b: {datasets: [b], link_share: 0.5}\n"
        )
        self.lives = BlockLives(tenant_of=lambda d: "team-a" if d[0] == "a" else "team-b")
        self.clock = Clock()
        self.window = LinkWindow(clock=self.clock)
        self.window.on_rtt(0.001)
        _deliver(self.window, self.clock, rate, 0.5)
        self.links = LinkShares(TenantShares(path, 1 << 30), self.lives, self.window, lambda: None)
        self.n = 0

    def prewarm(self, n: int) -> int:
        """Queue ``n`` more of team-a's prewarm blocks; how many one take lets out."""
        for _ in range(n):
            self.lives.want(f"a{self.n:06d}", BLOCK, Priority.PREWARM, None)
            self.n += 1
        return len(self.lives.take(Priority.PREWARM, 1 << 40, 1 << 20, self.links.gate()))


async def _later(seconds: float) -> None:
    await asyncio.sleep(seconds)


def test_a_share_holds_its_rate_not_only_its_window(tmp_path: Path) -> None:
    """0.25 of the 8 MiB window is 32 blocks; 0.25 of 200 MB/s refills 32 blocks' bucket
    at 50 MB/s: the first take empties the bucket, the next 0.02 s lets ~15 more out."""
    _bucket_refills_at(tmp_path, RATE, 0.25 * RATE)


def test_a_spoke_that_measured_only_light_reads_shares_at_least_a_gigabit(
    tmp_path: Path,
) -> None:
    """A reference of 5 MB/s (a light reader's misses) would hold the prewarm to 1.25 MB/s
    for as long as that reader reads; the floor makes it 0.25 of 1 Gbit/s."""
    _bucket_refills_at(tmp_path, 5e6, 0.25 * RATE_FLOOR_BPS)


def _bucket_refills_at(tmp_path: Path, measured: float, fill: float) -> None:
    world = World(tmp_path, 0.25, measured)

    async def go() -> None:
        world.lives.want("b-miss", BLOCK, Priority.DEMAND, None)  # team-b misses
        assert world.prewarm(200) == 32  # the bucket starts full: the window share
        for life in list(world.lives._flights.values()):  # they all arrive at once
            if life.tenant == "team-a" and life.state.name == "WIRE":
                world.lives.arrived(life.digest)
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert world.prewarm(0) <= 1  # the wire has room, the bucket (nearly) none
        await _later(0.02)
        refilled = fill * (loop.time() - started) / BLOCK
        assert 0.8 * fill * 0.02 / BLOCK <= world.prewarm(0) <= refilled + 2

    asyncio.run(go())


def test_a_tenant_nobody_competes_with_is_not_held(tmp_path: Path) -> None:
    world = World(tmp_path, 0.25)

    async def go() -> None:
        assert world.prewarm(200) == 200

    asyncio.run(go())


def test_a_share_smaller_than_a_block_still_sends_one_at_a_time(tmp_path: Path) -> None:
    world = World(tmp_path, 0.001)  # 0.1% of 8 MiB: under one block

    async def go() -> None:
        world.lives.want("b-miss", BLOCK, Priority.DEMAND, None)
        assert world.prewarm(8) == 1
        assert world.prewarm(0) == 0  # the one is still on the wire

    asyncio.run(go())


def test_holding_keeps_the_rate_measured_before_it(tmp_path: Path) -> None:
    """While shares hold, the link delivers only what they let through: a rate that
    followed it would shrink the share with every second of holding. The reference
    keeps the rate measured before; without holding it forgets by half every
    REFERENCE_HALF_LIFE_S."""
    world = World(tmp_path, 0.25)

    async def go() -> None:
        world.lives.want("b-miss", BLOCK, Priority.DEMAND, None)
        world.prewarm(200)  # held: the rest of the 200 wait
        _deliver(world.window, world.clock, RATE / 20, 5.0)  # held: 5 MB/s for 5 s
        assert world.window.rate_bps is not None and world.window.rate_bps < RATE / 10
        loop = asyncio.get_running_loop()
        assert world.links.reference_rate(loop.time() + 0.01) == pytest.approx(RATE, rel=0.05)
        later = loop.time() + REFERENCE_HALF_LIFE_S
        assert world.links.reference_rate(later) == pytest.approx(RATE / 2, rel=0.05)

    asyncio.run(go())


def test_demand_is_taken_in_turns_by_tenant(tmp_path: Path) -> None:
    """Issue 39's nineteenth probe: 64 readers of team-b missing at once queued team-a's
    misses behind all of theirs, in the batch and so on the wire (p50 0.15-1.2 s, 11 ms
    alone). A batch takes the tenants' demand in turns, each tenant's in order."""
    world = World(tmp_path, 0.25)

    async def go() -> list[str]:
        for i in range(6):
            world.lives.want(f"b{i}", BLOCK, Priority.DEMAND, None)
        for i in range(2):
            world.lives.want(f"a{i}", BLOCK, Priority.DEMAND, None)
        first = world.lives.take(Priority.DEMAND, 1 << 40, 4)
        rest = world.lives.take(Priority.DEMAND, 1 << 40, 64)
        return [life.digest for life in first + rest]

    assert asyncio.run(go()) == ["b0", "a0", "b1", "a1", "b2", "b3", "b4", "b5"]


def test_a_held_batch_starts_once_a_quarter_of_the_share_is_in(tmp_path: Path) -> None:
    """One block a stream as soon as a block's bytes were in cost the hub and the daemon a
    stream's CPU a block: a held tenant's batch waits until its bucket holds a quarter of
    its window share (0.25 x 8 MiB / 4 = 8 blocks, 10.5 ms at 50 MB/s), then goes whole."""
    world = World(tmp_path, 0.25)
    grain = 0.25 * (8 << 20) / 4

    async def go() -> None:
        loop = asyncio.get_running_loop()
        world.lives.want("b-miss", BLOCK, Priority.DEMAND, None)
        assert world.prewarm(200) == 32
        for life in list(world.lives._flights.values()):
            if life.tenant == "team-a" and life.state.name == "WIRE":
                world.lives.arrived(life.digest)
        started = loop.time()
        await _later(0.002)
        early = world.prewarm(0)
        if (loop.time() - started) * 0.25 * RATE < 0.9 * grain:  # (a slow box: too late)
            assert early == 0  # in the bucket: a block's bytes and more, not a quarter
        await _later(0.02)
        assert world.prewarm(0) >= grain // BLOCK

    asyncio.run(go())
