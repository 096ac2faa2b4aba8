"""What one peer's snapshot hints may make the owner ask its hub: a few loads at once per
caller and a few a minute after that, each failed name remembered for everyone, and a
memory of failures no caller can flush. What the peer port holds for callers: bounded in
all, half of it at most for one, fair shares once busy."""

from __future__ import annotations

import asyncio

from protocol.spoke.v1 import peer_pb2
from spoke.errors import NotFound
from spoke.mesh.admission import (
    HINT_LOADS_BURST,
    HINT_LOADS_PER_S,
    HINT_RETRY_S,
    MAX_FAILED,
    MemoryBudget,
    ScopeCheck,
)

SID = "0" * 32


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Scope:
    """The block scope index of a spoke that has stored nothing."""

    def names(self, snapshot_id: str) -> frozenset[tuple[str, str]]:
        return frozenset()


class Catalog:
    """What a ScopeCheck uses of a SnapshotCatalog; every load is a hub call that finds
    nothing (the versions are made up), counted."""

    def __init__(self) -> None:
        self.scope = Scope()
        self.loads: list[tuple[str, str]] = []

    async def manifest(self, dataset: str, version: str, stale_ok: bool = False) -> None:
        self.loads.append((dataset, version))
        raise NotFound(f"{dataset}@{version}: no such version")


def _hints(first: int, n: int = 8) -> list[peer_pb2.SnapshotRef]:
    return [
        peer_pb2.SnapshotRef(dataset="a", version=f"v{i}", snapshot_id=SID)
        for i in range(first, first + n)
    ]


def test_each_caller_starts_a_few_loads_and_failures_are_remembered_for_all() -> None:
    clock, catalog = Clock(), Catalog()
    check = ScopeCheck(catalog, now=clock)  # type: ignore[arg-type]

    async def go() -> None:
        for call in range(20):  # one caller naming 8 made-up versions a call, 160 in all
            await check.load(_hints(call * 8), ["a"], "flooder")
        assert len(catalog.loads) == HINT_LOADS_BURST  # its burst, then nothing
        await check.load(_hints(1000), ["a"], "other")  # another caller has its own
        assert len(catalog.loads) == 2 * HINT_LOADS_BURST
        await check.load(_hints(0), ["a"], "fresh")  # names that failed: not asked again
        await check.load(
            [peer_pb2.SnapshotRef(dataset="a", version="v0", snapshot_id="1" * 32)],
            ["a"],
            "fresh",
        )  # nor under another snapshot id
        assert len(catalog.loads) == 2 * HINT_LOADS_BURST
        clock.now += 1 / HINT_LOADS_PER_S  # the flooder's allowance refills by one
        await check.load(_hints(5000), ["a"], "flooder")
        assert len(catalog.loads) == 2 * HINT_LOADS_BURST + 1

    asyncio.run(go())


def test_the_memory_of_failures_cannot_be_flushed() -> None:
    clock, catalog = Clock(), Catalog()
    check = ScopeCheck(catalog, now=clock)  # type: ignore[arg-type]

    async def go() -> None:
        callers = MAX_FAILED // HINT_LOADS_BURST
        for i in range(callers):  # many callers (subjects) fill it
            await check.load(_hints(i * 8), ["a"], f"caller {i}")
        assert len(catalog.loads) == MAX_FAILED
        # full: nothing new is loaded, and what failed stays failed (asked of nobody)
        await check.load(_hints(0), ["a"], "late")
        await check.load(_hints(10**6), ["a"], "late")
        assert len(catalog.loads) == MAX_FAILED
        clock.now += HINT_RETRY_S + 1  # entries expire in their time, and loads resume
        await check.load(_hints(0, 1), ["a"], "late")
        assert catalog.loads[-1] == ("a", "v0") and len(catalog.loads) == MAX_FAILED + 1

    asyncio.run(go())


def test_a_dataset_outside_the_grant_is_never_loaded() -> None:
    catalog = Catalog()
    check = ScopeCheck(catalog)  # type: ignore[arg-type]
    asyncio.run(check.load(_hints(0), ["b"], "caller"))
    assert catalog.loads == []


def test_the_memory_budget_bounds_all_half_for_one_and_fair_shares_when_busy() -> None:
    budget = MemoryBudget(100)
    assert budget.take("a", 50) and not budget.take("a", 1)  # one caller: half at most
    assert budget.take("b", 30)  # 80 held: b under its share (100 // 2)
    assert not budget.take("b", 21)  # past it
    assert budget.take("c", 20) and budget.held == 100
    assert not budget.take("d", 1)  # full: nothing more for anyone
    budget.give("a", 50)
    assert budget.take("d", 33) and not budget.take("d", 1)  # busy: 100 // 3 each
    with budget.hold("e", 0) as held:  # nothing to hold: not counted as a holder
        assert held and budget.held_by("e") == 0
    with budget.hold("e", 17) as held:  # 100 held: e within its share, 100 // 4
        assert held and budget.held == 100 and budget.held_by("e") == 17
    assert budget.held == 83 and budget.held_by("e") == 0
    budget.give("c", 20)  # 63 held, by b and d
    assert not budget.take("e", 34)  # room for it, but past e's share (100 // 3)
    assert budget.take("e", 33) and budget.held == 96
