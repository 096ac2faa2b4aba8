"""Tenants' shares over a real cache and scheduler and a fake hub: one tenant's prewarm,
pins or reads cannot evict another tenant's blocks below its cache share, nor take more
than its link share while the other misses; per-tenant metrics count what each holds,
fetched and read."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from pathlib import Path

import pytest

from spoke import metrics
from spoke.cache.blockcache import BlockCache
from spoke.cache.lru import LRUPolicy
from spoke.cache.store import BlockStore, open_index
from spoke.cache.tenants import TenantShares
from spoke.disk.layout import CacheLayout, block_digest
from spoke.fetch.fetcher import Fetcher
from spoke.fetch.linkshare import DEMAND_RECENT_S
from spoke.fetch.scheduler import FetchScheduler, Priority
from spoke.fetch.window import LinkWindow
from spoke.prefetch.prewarm import CapacityError, PrewarmJobs
from spoke.upkeep.pins import PinRegistry

BLOCK = 4096
TENANTS = """
team-a:
  datasets: ["team-a*"]
  cache_share: 0.5
  link_share: 0.25
team-b:
  datasets: [team-b]
  cache_share: 0.25
  link_share: 0.5
"""


class Hub:
    """Serves blocks from a dict; a stream of ``gated`` blocks waits for ``gate``."""

    name = "hub:0"

    def __init__(self, blocks: dict[str, bytes]) -> None:
        self.blocks = blocks
        self.gate = asyncio.Event()
        self.gated: set[str] = set()
        self.wire: Callable[[], int] | None = None  # read at each stream's open
        self.wire_at_open: list[int] = []

    async def read_blocks(
        self, blocks: Sequence[tuple[str, int]], timeout: float, priority: Priority
    ) -> AsyncIterator[tuple[str, bytes]]:
        if self.wire is not None:
            self.wire_at_open.append(self.wire())
            await asyncio.sleep(0.002)  # a stream takes a while: the others open meanwhile
        for d, _ in blocks:
            if d in self.gated:
                await self.gate.wait()
            await asyncio.sleep(0)
            yield d, self.blocks[d]


class World:
    """A cache of ``cache_blocks`` blocks, a scheduler, and each team's blocks."""

    def __init__(
        self, tmp_path: Path, cache_blocks: int, tenants: bool = True, text: str = TENANTS
    ) -> None:
        self.refs: dict[str, list[tuple[str, int]]] = {}
        blobs: dict[str, bytes] = {}
        self.datasets: dict[str, str] = {}
        for team, n in (("team-a", 40), ("team-b", 20), ("other", 8)):
            self.refs[team] = []
            for i in range(n):
                data = f"{team} {i} ".encode().ljust(BLOCK, b".")
                digest = block_digest(data)
                blobs[digest] = data
                self.datasets[digest] = team
                self.refs[team].append((digest, BLOCK))
        layout = CacheLayout(tmp_path / "cache")
        capacity = cache_blocks * BLOCK
        self.cache = BlockCache(
            BlockStore(layout, open_index(layout)), LRUPolicy(capacity), capacity, 0.95, 0.9
        )
        self.hub = Hub(blobs)
        window = LinkWindow(floor=16 * BLOCK, ceiling=16 * BLOCK)
        self.scheduler = FetchScheduler(Fetcher(self.hub), self.cache, window=window)
        self.shares: TenantShares | None = None
        if tenants:
            path = tmp_path / "tenants.yaml"
            path.write_text(text)
            self.shares = TenantShares(path, capacity, self.datasets_of)
            self.cache.share_with(self.shares)
            self.scheduler.share_link(self.shares)

    def datasets_of(self, digests: Sequence[str]) -> Mapping[str, Iterable[str]]:
        return {d: [self.datasets[d]] for d in digests if d in self.datasets}

    def resident(self, team: str) -> int:
        return sum(1 for d, _ in self.refs[team] if self.cache.contains(d))


async def _prewarm(world: World, refs: list[tuple[str, int]]) -> None:
    for i in range(0, len(refs), 4):
        await world.scheduler.ensure(refs[i : i + 4], Priority.PREWARM)


@pytest.mark.parametrize("tenants", [True, False])
def test_a_prewarm_larger_than_its_share_leaves_the_other_tenant_its_share(
    tmp_path: Path, tenants: bool
) -> None:
    """team-b reads 8 blocks; team-a prewarms 40 into a 32-block cache. With tenants,
    team-b keeps its share (0.25 x 32 = 8 blocks); without (the control), LRU evicts
    team-b's older blocks first."""
    world = World(tmp_path, 32, tenants=tenants)

    async def go() -> None:
        await world.scheduler.ensure(world.refs["team-b"][:8])
        await _prewarm(world, world.refs["team-a"])

    asyncio.run(go())
    if tenants:
        assert world.resident("team-b") == 8
        assert world.shares is not None
        assert world.shares.resident_bytes("team-b") == 8 * BLOCK
        assert world.shares.resident_bytes("team-a") == world.resident("team-a") * BLOCK
        assert world.cache.used_bytes <= world.cache.capacity_bytes
    else:
        assert world.resident("team-b") == 0


def test_a_tenant_above_its_share_is_evictable_down_to_it(tmp_path: Path) -> None:
    """team-b holds 12 blocks (share 8): team-a's prewarm may take 4 of them, no more."""
    world = World(tmp_path, 32)

    async def go() -> None:
        await world.scheduler.ensure(world.refs["team-b"][:12])
        await _prewarm(world, world.refs["team-a"])

    asyncio.run(go())
    assert world.resident("team-b") == 8


def test_an_admission_that_finds_only_other_tenants_shares_streams_through(
    tmp_path: Path,
) -> None:
    """A cache of 12 blocks: team-a holds its share (6), team-b its (3). Blocks of no
    tenant come and go among themselves in the 3 left; once those 3 are pinned, the next
    finds only shares and pins in its way: refused, its bytes go to the reader."""
    world = World(tmp_path, 12)
    other = world.refs["other"]

    async def go() -> tuple[dict[str, bytes], dict[str, bytes]]:
        await world.scheduler.ensure(world.refs["team-a"][:6])
        await world.scheduler.ensure(world.refs["team-b"][:3])
        _, cycled = await world.scheduler.ensure(other[:5])
        world.cache.pin([d for d, _ in other[2:5]])
        _, uncached = await world.scheduler.ensure(other[5:7])
        return cycled, uncached

    cycled, uncached = asyncio.run(go())
    assert world.resident("team-a") == 6 and world.resident("team-b") == 3
    assert cycled == {} and world.resident("other") == 3
    assert sorted(uncached) == sorted(d for d, _ in other[5:7])
    for digest, data in uncached.items():
        assert world.hub.blocks[digest] == data


def test_pinned_blocks_count_for_their_tenant(tmp_path: Path) -> None:
    """team-b's two pinned blocks stay its own; team-a's prewarm of 10 blocks into the 6
    left evicts only its own."""
    world = World(tmp_path, 8)

    async def go() -> None:
        await world.scheduler.ensure(world.refs["team-b"][:2])
        world.cache.pin([d for d, _ in world.refs["team-b"][:2]])
        await _prewarm(world, world.refs["team-a"][:10])

    asyncio.run(go())
    assert world.shares is not None
    assert world.shares.resident_bytes("team-b") == 2 * BLOCK  # pinned, still theirs
    assert world.resident("team-b") == 2 and world.resident("team-a") == 6


def test_the_background_evictor_keeps_every_tenants_share(tmp_path: Path) -> None:
    world = World(tmp_path, 16)

    async def go() -> None:
        evictor = asyncio.create_task(world.cache.run_evictor())
        await world.scheduler.ensure(world.refs["team-b"][:4])
        await world.scheduler.ensure(world.refs["team-a"][:8])
        await world.scheduler.ensure(world.refs["other"][:4])  # 16 of 16: past 95 %
        for _ in range(100):
            await asyncio.sleep(0.001)
        evictor.cancel()

    asyncio.run(go())
    assert world.resident("team-b") == 4 and world.resident("team-a") == 8
    assert world.cache.ranked_bytes <= world.cache.low_bytes + BLOCK  # 'other' gave way


@pytest.mark.parametrize("other_misses", [True, False])
def test_prefetch_takes_at_most_its_link_share_while_another_tenant_misses(
    tmp_path: Path, other_misses: bool
) -> None:
    """While team-b's demand miss is held on the wire, team-a's prewarm of 20 blocks has
    at most 0.25 x the 16-block window on the wire (4 blocks) and still goes on; without
    the miss (the control) it takes more of the window."""
    world = World(tmp_path, 64)
    miss = world.refs["team-b"][0]
    world.hub.gated.add(miss[0])
    lives = world.scheduler.lives
    world.hub.wire = lambda: lives.ahead_wire["team-a"]

    async def go() -> None:
        reader = None
        if other_misses:
            reader = asyncio.create_task(world.scheduler.ensure([miss]))
            await asyncio.sleep(0.01)
        await world.scheduler.ensure(world.refs["team-a"][:20], Priority.PREWARM)
        world.hub.gate.set()
        if reader is not None:
            await reader

    asyncio.run(go())
    assert world.resident("team-a") == 20
    if other_misses:
        assert max(world.hub.wire_at_open) <= 4 * BLOCK
    else:
        assert max(world.hub.wire_at_open) > 4 * BLOCK


def test_per_tenant_metrics_count_resident_admitted_and_reads(tmp_path: Path) -> None:
    world = World(tmp_path, 64)
    shares = world.shares
    assert shares is not None

    def value(name: str, **labels: str) -> float:
        got = metrics.REGISTRY.get_sample_value(name, labels)
        return got or 0.0

    admitted0 = value("strata_spoke_tenant_admitted_bytes_total", tenant="team-b")
    hits0 = value("strata_spoke_tenant_reads_total", tenant="team-b", outcome="hit")

    async def go() -> None:
        await world.scheduler.ensure(world.refs["team-b"][:3])

    asyncio.run(go())
    shares.reads([d for d, _ in world.refs["team-b"][:3]], hit=True)
    shares.reads([world.refs["team-a"][0][0]], hit=False)
    assert value("strata_spoke_tenant_resident_bytes", tenant="team-b") == 3 * BLOCK
    assert value("strata_spoke_tenant_admitted_bytes_total", tenant="team-b") - admitted0 == (
        3 * BLOCK
    )
    assert value("strata_spoke_tenant_reads_total", tenant="team-b", outcome="hit") - hits0 == 3
    assert shares.snapshot()["team-b"]["resident_bytes"] == 3 * BLOCK
    assert shares.snapshot()["team-b"]["share_bytes"] == 16 * BLOCK


def test_resident_blocks_are_attributed_again_at_start(tmp_path: Path) -> None:
    world = World(tmp_path, 64, tenants=False)

    async def go() -> None:
        await world.scheduler.ensure(world.refs["team-b"][:5])

    asyncio.run(go())
    path = tmp_path / "tenants.yaml"
    path.write_text(TENANTS)
    shares = TenantShares(path, world.cache.capacity_bytes, world.datasets_of)
    world.cache.share_with(shares)
    assert shares.resident_bytes("team-b") == 5 * BLOCK
    assert shares.owner(world.refs["team-b"][0][0]) == ("team-b", BLOCK)


def test_a_tenants_pins_stop_where_the_other_tenants_shares_begin(tmp_path: Path) -> None:
    """Pinned blocks are never evicted: team-a (share 0.5 of 32 blocks) may pin at most
    the cache less team-b's share (32 - 8 = 24 blocks), so its pins cannot keep team-b
    below its share — counted from the pins recorded, fetched or not (a probe pinned 48
    MiB of a 32 MiB allowance in two requests before anything had arrived)."""
    world = World(tmp_path, 32)
    pins = PinRegistry(world.cache.store._env, world.cache)
    jobs = PrewarmJobs(None, world.cache, world.scheduler, pins)  # type: ignore[arg-type]
    team_a = world.refs["team-a"]
    first = dict(team_a[:20])  # recorded, nothing fetched yet
    jobs.check_pin_room("team-a@v1", first, "team-a")
    pins.add("team-a", "v1", "v1", ["*"], first)
    jobs.check_pin_room("team-a@v1", dict(team_a[20:24]), "team-a")  # 24: fits
    with pytest.raises(CapacityError, match="hold 81,920 pinned bytes and may pin at most"):
        jobs.check_pin_room("team-a@v1", dict(team_a[20:25]), "team-a")
    jobs.check_pin_room("team-b@v1", dict(world.refs["team-b"][:12]), "team-b")  # its room
    # a dataset no tenant names: what no share holds (32 - 16 - 8 = 8 blocks), together
    # (the seventeenth probe: such pins passed the cache and squeezed every tenant)
    other = world.refs["other"]
    jobs.check_pin_room("other@v1", dict(other[:8]), "other")
    pins.add("other", "v1", "v1", ["*"], dict(other[:6]))
    with pytest.raises(CapacityError, match="datasets no tenant names hold"):
        jobs.check_pin_room("other@v1", dict([*other[6:8], ("ff" * 16, 4096)]), "other")


def test_a_miss_that_just_ended_still_holds_the_other_tenants_prefetch_to_its_share(
    tmp_path: Path,
) -> None:
    """A reader between two misses has nothing on the wire: team-a's prewarm right after
    team-b's miss keeps to its share anyway (for DEMAND_RECENT_S); one whose share is 0
    goes on at the least share, a block at a time (a timer wakes the scheduler when its
    bucket has room: nothing else would), not stopped (the nineteenth probe: a prewarm
    at 0 moved no byte for as long as another team read)."""
    world = World(tmp_path, 64, text=TENANTS.replace("link_share: 0.25", "link_share: 0"))
    lives = world.scheduler.lives
    world.hub.wire = lambda: lives.ahead_wire["team-a"]

    async def go() -> float:
        await world.scheduler.ensure(world.refs["team-b"][:1])  # done: nothing on the wire
        loop = asyncio.get_running_loop()
        started = loop.time()
        await world.scheduler.ensure(world.refs["team-a"][:8], Priority.PREWARM)
        return loop.time() - started

    took = asyncio.run(go())
    assert world.resident("team-a") == 8
    assert max(world.hub.wire_at_open) <= BLOCK  # one block at a time: held, not stopped
    assert took < DEMAND_RECENT_S  # it did not wait for team-b's miss to age


@pytest.mark.parametrize("other_misses", [True, False])
def test_a_dataset_no_tenant_names_keeps_to_what_the_shares_leave(
    tmp_path: Path, other_misses: bool
) -> None:
    """The eighteenth probe: a prewarm of a dataset no tenant names was never held, and ran
    2.7 times faster than a tenant's. Now, while team-b misses, such fetches together keep
    to what the tenants' link shares leave (1 - 0.25 - 0.5 of the 16-block window: 4)."""
    world = World(tmp_path, 64)
    miss = world.refs["team-b"][0]
    world.hub.gated.add(miss[0])
    lives = world.scheduler.lives
    world.hub.wire = lambda: lives.ahead_wire[None]

    async def go() -> None:
        reader = None
        if other_misses:
            reader = asyncio.create_task(world.scheduler.ensure([miss]))
            await asyncio.sleep(0.01)
        await world.scheduler.ensure(world.refs["other"], Priority.PREWARM)
        world.hub.gate.set()
        if reader is not None:
            await reader

    asyncio.run(go())
    if other_misses:
        assert max(world.hub.wire_at_open) <= 4 * BLOCK
    else:
        assert max(world.hub.wire_at_open) > 4 * BLOCK
