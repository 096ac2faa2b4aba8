"""Prewarm batching (bounded by blocks and bytes, in order, nothing lost), the job history,
and what a job or pin keeps of its request."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from spoke.cache.blockcache import BlockCache
from spoke.cache.registry import make_policy
from spoke.cache.store import BlockStore, open_index
from spoke.catalog.selection import preview
from spoke.disk.layout import CacheLayout
from spoke.prefetch import prewarm as prewarm_module
from spoke.prefetch.prewarm import (
    KEEP_FINISHED,
    Job,
    PrewarmJobs,
    SelectionSlots,
    fetch_batches,
)
from spoke.upkeep.pins import PinRegistry


def test_batches_keep_order_and_respect_both_bounds() -> None:
    blocks = [(f"{i:032x}", size) for i, size in enumerate([10, 10, 30, 5, 5, 5, 5, 100, 1])]
    batches = fetch_batches(blocks, most_blocks=3, most_bytes=40)
    assert [b for batch in batches for b in batch] == blocks
    assert [len(b) for b in batches] == [2, 3, 2, 1, 1]
    assert all(sum(s for _, s in b) <= 40 or len(b) == 1 for b in batches)  # 100 alone


def test_small_blocks_fill_batches_large_ones_go_alone() -> None:
    small = [(f"{i:032x}", 64 << 10) for i in range(40)]
    assert [len(b) for b in fetch_batches(small)] == [16, 16, 8]
    large = [(f"{i:032x}", 64 << 20) for i in range(3)]
    assert [len(b) for b in fetch_batches(large)] == [1, 1, 1]
    assert fetch_batches([]) == []


def test_the_history_keeps_each_datasets_newest_finished_jobs() -> None:
    jobs = PrewarmJobs(None, None, None, None)  # type: ignore[arg-type]  # only the history

    def job(dataset: str, started: float, state: str = "done") -> Job:
        j = Job(f"{dataset}-{started}", dataset, "v1", "v1", ["*"], False, 1, {"d": 1})
        j.state, j.started = state, started  # type: ignore[assignment]
        jobs._jobs[j.id] = j
        return j

    theirs = job("team-b", 0.0)  # one job of another team, then 300 of team-a's
    mine = [job("team-a", 1.0 + i) for i in range(300)]
    running = job("team-a", 0.5, "running")
    jobs._forget_old()
    kept = jobs.all()
    assert theirs in kept and running in kept  # not pushed out; running jobs stay
    assert [j for j in kept if j.dataset == "team-a" and j is not running] == mine[::-1][
        :KEEP_FINISHED
    ]
    assert theirs.public()["blocks"] == 1


def test_a_job_and_a_pin_keep_a_preview_of_their_globs(tmp_path: Path) -> None:
    """The tenth probe: 150 pins of 8 MB of globs each took the daemon to 1.3 GiB, and
    ``GET /v1/pins`` built a 1.2 GB body; each keeps about 1 KiB of them now."""
    globs = [f"train/shard-{i:05d}/part-*.tar" for i in range(2000)]
    job = Job("j", "ds", "v1", "v1", globs, False, 1, {"d": 1})
    assert job.paths == preview(globs) and job.public()["paths_total"] == 2000
    assert len(job.public()["paths"]) < 2000  # type: ignore[arg-type]
    layout = CacheLayout(tmp_path / "cache")
    layout.root.mkdir()
    env = open_index(layout)
    cache = BlockCache(BlockStore(layout, env), make_policy("lru", 1 << 20), 1 << 20)
    pin = PinRegistry(env, cache).add("ds", "v1", "v1", globs, {"d" * 32: 10})
    assert pin.paths == preview(globs) and pin.public()["paths_total"] == 2000
    [again] = PinRegistry(env, cache).all()  # as stored: the preview and the count
    assert again.paths == pin.paths and again.paths_total == 2000


def test_selection_slots_hold_one_per_caller_and_serve_another_meanwhile() -> None:
    """The eleventh probe: one token's two requests held both matching slots and another
    team's one-file prewarm waited 98 s; a caller now holds one slot at a time."""

    async def scenario() -> list[str]:
        slots = SelectionSlots(2)
        order: list[str] = []
        release = asyncio.Event()

        async def select(caller: str, name: str) -> None:
            async with slots.slot(caller):
                order.append(name)
                await release.wait()

        first = asyncio.create_task(select("team-a", "a1"))
        second = asyncio.create_task(select("team-a", "a2"))  # waits: team-a holds one
        await asyncio.sleep(0.05)
        other = asyncio.create_task(select("team-b", "b1"))  # the second slot is free
        await asyncio.sleep(0.05)
        assert order == ["a1", "b1"]
        third = asyncio.create_task(select("team-c", "c1"))  # both slots held: waits
        await asyncio.sleep(0.05)
        assert order == ["a1", "b1"]
        release.set()
        await asyncio.gather(first, second, other, third)
        return order

    order = asyncio.run(scenario())
    assert order[:2] == ["a1", "b1"] and sorted(order[2:]) == ["a2", "c1"]


def test_a_freed_selection_slot_goes_to_the_caller_served_least_lately() -> None:
    """The twelfth probe: five colluding tokens each kept requests waiting, and another
    team's one-file prewarm waited 20 s behind them in arrival order; a caller never
    served goes first."""

    async def scenario() -> list[str]:
        slots = SelectionSlots(1)
        order: list[str] = []
        gates = {name: asyncio.Event() for name in ("a1", "b1", "c1", "a2", "light")}

        async def select(caller: str, name: str) -> None:
            async with slots.slot(caller):
                order.append(name)
                await gates[name].wait()

        tasks = [asyncio.create_task(select("team-a", "a1"))]
        await asyncio.sleep(0)
        for caller, name in (("team-b", "b1"), ("team-c", "c1"), ("team-a", "a2")):
            tasks.append(asyncio.create_task(select(caller, name)))
            await asyncio.sleep(0)
        for name in ("a1", "b1"):  # two heavy callers served in turn meanwhile
            gates[name].set()
            while name == order[-1]:
                await asyncio.sleep(0)
        tasks.append(asyncio.create_task(select("light", "light")))  # arrives last
        await asyncio.sleep(0)
        for name in ("c1", "light", "a2"):
            gates[name].set()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        return order

    order = asyncio.run(scenario())
    # a1, then b1 and c1 (never served) before a2; the light caller, never served, goes
    # before team-a's second request although it arrived after it
    assert order == ["a1", "b1", "c1", "light", "a2"], order


def test_a_caller_cancelled_while_waiting_leaves_no_slot_taken() -> None:
    async def scenario() -> None:
        slots = SelectionSlots(1)
        release = asyncio.Event()

        async def hold() -> None:
            async with slots.slot("a"):
                await release.wait()

        first = asyncio.create_task(hold())
        await asyncio.sleep(0)
        waiting = asyncio.create_task(hold())  # same caller: waits
        other = asyncio.create_task(hold())
        await asyncio.sleep(0)
        waiting.cancel()
        release.set()
        await asyncio.wait_for(asyncio.gather(first, other), 5)
        async with asyncio.timeout(5), slots.slot("b"):  # nothing left held
            pass

    asyncio.run(scenario())


def test_a_light_caller_served_lately_still_goes_before_heavy_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The twelfth probe, after the least-lately-served rule: the light team posts one
    request after another, so it was always the caller served last, and waited 11.6 s
    behind five heavy ones. Seconds held decide: its milliseconds weigh less than their
    seconds."""
    clock = [1000.0]
    monkeypatch.setattr(prewarm_module.time, "monotonic", lambda: clock[0])

    async def scenario() -> list[str]:
        slots = SelectionSlots(1)
        order: list[str] = []
        for caller, held in (("heavy-1", 2.5), ("heavy-2", 2.5), ("light", 0.01)):
            async with slots.slot(caller):  # each held once, in turn: light served last
                clock[0] += held
        gate = asyncio.Event()

        async def select(caller: str) -> None:
            async with slots.slot(caller):
                order.append(caller)
                await gate.wait()

        tasks = [asyncio.create_task(select("heavy-3"))]
        await asyncio.sleep(0)
        for caller in ("heavy-1", "heavy-2", "light"):  # light arrives last
            tasks.append(asyncio.create_task(select(caller)))
            await asyncio.sleep(0)
        gate.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        return order

    assert asyncio.run(scenario()) == ["heavy-3", "light", "heavy-1", "heavy-2"]


def test_a_light_caller_takes_the_light_slot_while_heavy_ones_hold_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The thirteenth probe: a manifest's decode is not bounded by the match budget, so a
    light team waited for a heavy selection's decode and match to end (3.8-4.6 s behind
    five colluding tokens on a 400,000-file dataset). A caller that held slots less than
    LIGHT_USE_S takes the light slot at once; a heavy caller never does."""
    clock = [1000.0]
    monkeypatch.setattr(prewarm_module.time, "monotonic", lambda: clock[0])

    async def scenario() -> list[str]:
        slots = SelectionSlots(1, light=1)
        for caller in ("heavy-1", "heavy-2"):
            async with slots.slot(caller):  # each held 3 s, once
                clock[0] += 3.0
        order: list[str] = []
        gates = {name: asyncio.Event() for name in ("heavy-1", "heavy-2", "light", "fresh")}

        async def select(caller: str) -> None:
            async with slots.slot(caller):
                order.append(caller)
                await gates[caller].wait()

        tasks = [asyncio.create_task(select("heavy-1"))]
        await asyncio.sleep(0)
        tasks.append(asyncio.create_task(select("heavy-2")))  # waits: not light
        await asyncio.sleep(0)
        assert order == ["heavy-1"]
        tasks.append(asyncio.create_task(select("light")))  # the light slot, at once
        await asyncio.sleep(0)
        assert order == ["heavy-1", "light"]
        tasks.append(asyncio.create_task(select("fresh")))  # light, but the lane is taken
        await asyncio.sleep(0)
        assert order == ["heavy-1", "light"]
        gates["light"].set()
        for _ in range(5):  # the clock stands still: let the release run
            await asyncio.sleep(0)
        assert order == ["heavy-1", "light", "fresh"]  # the lane again, before heavy-2
        for gate in gates.values():
            gate.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        return order

    assert asyncio.run(scenario()) == ["heavy-1", "light", "fresh", "heavy-2"]


def test_a_light_slot_takes_small_selections_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fourteenth probe: eight tokens taking turns, each light again after a rest, kept
    the light slot decoding a 400,000-file manifest, and a light team's one-file prewarm
    waited up to 10.2 s. A large selection waits for a slot any caller may take, however
    light its caller; a small one of a light caller still takes the light slot at once."""
    clock = [1000.0]
    monkeypatch.setattr(prewarm_module.time, "monotonic", lambda: clock[0])

    async def scenario() -> list[str]:
        slots = SelectionSlots(1, light=1)
        order: list[str] = []
        gates = {name: asyncio.Event() for name in ("rotating-1", "rotating-2", "team")}

        async def select(caller: str, small: bool) -> None:
            async with slots.slot(caller, small):
                order.append(caller)
                await gates[caller].wait()

        tasks = [asyncio.create_task(select("rotating-1", False))]
        await asyncio.sleep(0)
        tasks.append(asyncio.create_task(select("rotating-2", False)))  # light, but large
        await asyncio.sleep(0)
        assert order == ["rotating-1"]
        tasks.append(asyncio.create_task(select("team", True)))  # the light slot, at once
        await asyncio.sleep(0)
        assert order == ["rotating-1", "team"]
        for gate in gates.values():
            gate.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        return order

    assert asyncio.run(scenario()) == ["rotating-1", "team", "rotating-2"]
