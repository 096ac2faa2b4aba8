"""hub.limits.turns: listing builds shared in turn between tokens, never more at once than
the slots, and a cancelled wait neither keeps nor loses a slot."""

from __future__ import annotations

import asyncio

import pytest

from hub.limits.turns import FairTurns


async def _run(turns: FairTurns, token: str, order: list[str], go: asyncio.Event) -> None:
    async with turns.turn(token):
        order.append(token)
        await go.wait()


def test_a_token_with_one_call_waits_one_turn_behind_a_token_with_many() -> None:
    async def main() -> list[str]:
        turns, order, go = FairTurns(2), [], asyncio.Event()
        flood = [asyncio.create_task(_run(turns, "a", order, go)) for _ in range(10)]
        await asyncio.sleep(0)  # two of a's hold the slots, eight wait
        light = asyncio.create_task(_run(turns, "b", order, go))
        await asyncio.sleep(0)
        assert turns.held == 2 and turns.waiting == 9
        go.set()  # each call finishes as soon as it holds a slot
        await asyncio.gather(*flood, light)
        assert turns.held == 0 and turns.waiting == 0
        return order

    order = asyncio.run(main())
    # after the two holders, a's next and then b: b waits behind one call of a, not eight
    assert order.index("b") <= 3 and order.count("a") == 10


def test_tokens_take_turns_and_never_more_than_the_slots_hold_at_once() -> None:
    async def main() -> tuple[list[str], int]:
        turns, order, most = FairTurns(1), [], 0

        async def call(token: str) -> None:
            nonlocal most
            async with turns.turn(token):
                most = max(most, turns.held)
                order.append(token)
                await asyncio.sleep(0)

        blocker = asyncio.Event()

        async def first() -> None:
            async with turns.turn("x"):
                await blocker.wait()

        held = asyncio.create_task(first())
        await asyncio.sleep(0)
        tasks = [asyncio.create_task(call(t)) for t in "aaabbbc"]
        await asyncio.sleep(0)
        blocker.set()
        await asyncio.gather(held, *tasks)
        return order, most

    order, most = asyncio.run(main())
    assert order == ["a", "b", "c", "a", "b", "a", "b"] and most == 1


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
