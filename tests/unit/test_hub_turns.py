"""hub.limits.turns: page builds shared between tokens by the time each held the slots
lately (least first), never more at once than the slots, and a cancelled wait neither
keeps nor loses a slot."""

from __future__ import annotations

import asyncio

import pytest

from hub.limits import turns as turns_module
from hub.limits.turns import HALF_LIFE_S, FairTurns


class Clock:
    """Seconds that pass only when a call says it worked."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def _run(turns: FairTurns, token: str, order: list[str], go: asyncio.Event) -> None:
    async with turns.turn(token):
        order.append(token)
        await go.wait()


def test_a_token_with_one_call_goes_before_a_token_that_keeps_building() -> None:
    clock = Clock()

    async def main() -> list[str]:
        turns, order, go = FairTurns(2, clock), [], asyncio.Event()

        async def build(token: str, seconds: float) -> None:
            async with turns.turn(token):
                order.append(token)
                await go.wait()
                clock.now += seconds

        flood = [asyncio.create_task(build("a", 1.0)) for _ in range(10)]
        await asyncio.sleep(0)  # two of a's hold the slots, eight wait
        light = asyncio.create_task(build("b", 0.1))
        await asyncio.sleep(0)
        assert turns.held == 2 and turns.waiting == 9
        go.set()
        await asyncio.gather(*flood, light)
        assert turns.held == 0 and turns.waiting == 0
        return order

    order = asyncio.run(main())
    assert order.index("b") == 2 and order.count("a") == 10  # the first slot freed is b's


def test_tokens_share_the_slot_by_the_time_they_held_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(turns_module, "HALF_LIFE_S", 1e9)  # no decay: exact sums
    clock = Clock()

    async def main() -> tuple[list[str], int]:
        turns, order, most = FairTurns(1, clock), [], 0

        async def build(token: str, seconds: float) -> None:
            nonlocal most
            async with turns.turn(token):
                most = max(most, turns.held)
                order.append(token)
                await asyncio.sleep(0)
                clock.now += seconds

        blocker = asyncio.Event()

        async def first() -> None:
            async with turns.turn("x"):
                await blocker.wait()

        held = asyncio.create_task(first())
        await asyncio.sleep(0)
        costs = {"a": 3.0, "b": 1.0, "c": 1.0}
        tasks = [asyncio.create_task(build(t, costs[t])) for t in "aaabbbc"]
        await asyncio.sleep(0)
        blocker.set()
        await asyncio.gather(held, *tasks)
        return order, most

    order, most = asyncio.run(main())
    # a (3 s), then b and c (0 s each so far), then b twice (1, 2 s < a's 3), then a's
    # (equal at 3 s: a queued first), never two at once
    assert order == ["a", "b", "c", "b", "b", "a", "a"] and most == 1


def test_past_use_counts_half_after_each_half_life() -> None:
    clock = Clock()

    async def main() -> FairTurns:
        turns = FairTurns(1, clock)
        async with turns.turn("a"):
            clock.now += 8.0
        return turns

    turns = asyncio.run(main())
    assert turns.used("a") == pytest.approx(8.0) and turns.used("b") == 0.0
    clock.now += HALF_LIFE_S
    assert turns.used("a") == pytest.approx(4.0)


def test_a_cancelled_wait_gives_up_its_place_and_a_cancelled_grant_passes_the_slot_on() -> None:
    async def main() -> None:
        turns, order, go = FairTurns(1), [], asyncio.Event()
        holder = asyncio.create_task(_run(turns, "a", order, go))
        await asyncio.sleep(0)
        gone = asyncio.create_task(_run(turns, "b", order, go))
        after = asyncio.create_task(_run(turns, "c", order, go))
        await asyncio.sleep(0)
        gone.cancel()  # waiting: leaves its queue
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert turns.waiting == 1
        go.set()
        await asyncio.gather(holder, after)
        assert order == ["a", "c"] and turns.held == 0

        # given the slot and cancelled before it ran: the slot goes to the next waiter
        held = turns.turn("a")
        await held.__aenter__()
        granted = asyncio.create_task(_run(turns, "b", order, go))
        nxt = asyncio.create_task(_run(turns, "c", order, go))
        await asyncio.sleep(0)
        await held.__aexit__(None, None, None)  # hands the slot to b's future, no switch
        granted.cancel()  # before b's task resumes
        with pytest.raises(asyncio.CancelledError):
            await granted
        await nxt
        assert order == ["a", "c", "c"] and turns.held == 0 and turns.waiting == 0

    asyncio.run(main())


def test_no_slot_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        FairTurns(0)
