"""The read budget's accounting (shares, waiting in order, refusal after the wait) and the
grant limiter's windows, including a spoke that renews at half the lifetime forever."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from hub.auth.grants import ISSUES_PER_HOLDER, GrantLimiter
from hub.errors import QuotaExceeded
from hub.limits.budget import ReadBudget, block_charge
from hub.limits.slots import RESERVED_BELOW, reserved_slots


def test_a_block_is_charged_with_its_two_chunk_copies() -> None:
    assert block_charge(4 << 20, 1 << 20) == 6 << 20
    assert block_charge(4096, 1 << 20) == 3 * 4096


def test_one_tokens_share_leaves_the_rest_to_others_and_waiters_are_served_in_order() -> None:
    async def run() -> None:
        budget = ReadBudget(streams_per_token=8, bytes_per_token=10, total_bytes=16, wait_s=5)
        await budget.take("a", 10)
        waiting_a = asyncio.ensure_future(budget.take("a", 4))
        await asyncio.sleep(0)
        assert not waiting_a.done()  # a is at its share
        await asyncio.wait_for(budget.take("b", 6), 1)  # b is not held up behind a
        waiting_b = asyncio.ensure_future(budget.take("b", 4))  # the hub is full now
        await asyncio.sleep(0)
        assert not waiting_b.done() and not budget.try_take("c", 1)
        budget.release("a", 10)
        await asyncio.wait_for(asyncio.gather(waiting_a, waiting_b), 1)
        assert (budget.held_by("a"), budget.held_by("b"), budget.held) == (4, 10, 14)

    asyncio.run(run())


def test_room_given_back_goes_first_to_the_token_that_holds_least() -> None:
    """Tokens that keep queueing streams they never read must not take every byte the
    stall deadline gives back: a token holding nothing is served before them, whatever
    the arrival order."""

    async def run() -> None:
        budget = ReadBudget(bytes_per_token=60, total_bytes=100, wait_s=5)
        await budget.take("x", 50)
        await budget.take("y", 50)
        greedy = [asyncio.ensure_future(budget.take(n, 10)) for n in ("x", "y", "x", "y")]
        await asyncio.sleep(0)
        victim = asyncio.ensure_future(budget.take("v", 10))  # arrived last, holds nothing
        await asyncio.sleep(0)
        budget.release("x", 10)  # a stall deadline gives 10 bytes back
        await asyncio.wait_for(victim, 1)
        assert not any(g.done() for g in greedy)
        assert (budget.held_by("v"), budget.held) == (10, 100)
        for g in greedy:
            g.cancel()

    asyncio.run(run())


def test_a_charge_without_room_is_refused_after_the_wait_and_holds_nothing() -> None:
    async def run() -> None:
        budget = ReadBudget(bytes_per_token=10, total_bytes=10, wait_s=0.05)
        await budget.take("a", 8)
        with pytest.raises(QuotaExceeded, match="--max-bytes-per-token 10") as refused:
            await budget.take("a", 8)
        assert refused.value.limit == "bytes"
        assert budget.held == 8
        budget.release("a", 8)
        await asyncio.wait_for(budget.take("a", 100), 1)  # larger than the budget: alone
        assert budget.held == 100

    asyncio.run(run())


def test_a_cancelled_waiter_leaves_no_charge() -> None:
    async def run() -> None:
        budget = ReadBudget(bytes_per_token=10, total_bytes=10, wait_s=5)
        await budget.take("a", 10)
        waiter = asyncio.ensure_future(budget.take("a", 5))
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        budget.release("a", 10)
        assert budget.held == 0 and budget.held_by("a") == 0

    asyncio.run(run())


def test_what_a_stalled_stream_leaves_in_core_stays_on_its_token_not_the_hubs_total() -> None:
    async def run() -> None:
        budget = ReadBudget(bytes_per_token=10, total_bytes=12, wait_s=5, stall_s=1)
        await budget.take("a", 10)
        waiter = asyncio.ensure_future(budget.take("b", 6))
        await asyncio.sleep(0)
        assert not waiter.done()  # the hub is full
        # a's stream stalls: its charge goes, the message core keeps stays a's
        pooled = budget.take_stalled("a", 3)
        budget.release("a", 10)
        await asyncio.wait_for(waiter, 1)  # another token gets the room
        assert pooled and (budget.held, budget.stalled, budget.held_by("a")) == (6, 3, 3)
        assert not budget.try_take("a", 8)  # a's own share counts what it left stalled
        # the stalled pool is half the total; beyond, the hub's total takes it
        assert budget.take_stalled("c", 3) and not budget.take_stalled("c", 1)
        assert (budget.held, budget.stalled) == (7, 6)
        budget.release_stalled("c", 1, False)
        budget.release_stalled("c", 3, True)
        budget.release_stalled("a", 3, True)
        budget.release("b", 6)
        assert (budget.held, budget.stalled, budget.held_by("a"), budget.held_by("c")) == (
            0,
            0,
            0,
            0,
        )
        with pytest.raises(ValueError, match="stall"):
            ReadBudget(stall_s=0)

    asyncio.run(run())


def test_streams_per_token_are_capped() -> None:
    budget = ReadBudget(streams_per_token=2)
    with budget.stream("a"), budget.stream("a"):
        with pytest.raises(QuotaExceeded, match="--max-streams-per-token 2"), budget.stream("a"):
            pass
        with budget.stream("b"):
            assert budget.streams_of("b") == 1
    assert budget.streams_of("a") == 0


def test_streams_of_every_token_together_are_capped() -> None:
    budget = ReadBudget(streams_per_token=2, total_streams=3)
    with budget.stream("a"), budget.stream("a"), budget.stream("b"):
        assert not budget.stream_room("c") and not budget.stream_room("b")
        with (
            pytest.raises(QuotaExceeded, match=r"allows 3 \(--max-block-streams\)") as refused,
            budget.stream("c"),
        ):
            pass
        assert refused.value.limit == "streams"
        assert budget.streams_of("c") == 0
    assert budget.streams == 0 and budget.stream_room("c")


def test_the_last_eighth_of_the_streams_is_kept_for_tokens_holding_few() -> None:
    """Four tokens at their 512 streams would fill 2,048 (issue 39's re-probe): the last
    256 go only to tokens holding fewer than 16, so a fifth token still gets in."""
    budget = ReadBudget(streams_per_token=512, total_streams=2048)
    with contextlib.ExitStack() as held:
        for token in "abcd":
            while budget.stream_room(token):
                held.enter_context(budget.stream(token))
        assert budget.streams == 2048 - reserved_slots(2048) == 1792
        assert [budget.streams_of(token) for token in "abcd"] == [512, 512, 512, 256]
        with pytest.raises(QuotaExceeded, match="the last 256 only to tokens holding fewer"):
            held.enter_context(budget.stream("d"))
        for n in range(RESERVED_BELOW):  # a fifth token: a spoke's full concurrency
            assert budget.stream_room("e"), n
            held.enter_context(budget.stream("e"))
        assert not budget.stream_room("e") and budget.stream_room("f")
    assert budget.streams == 0


def test_a_token_that_left_a_quarter_of_its_share_stalled_opens_no_more_streams() -> None:
    budget = ReadBudget(bytes_per_token=40, total_bytes=100)
    assert budget.stalled_per_token == 10
    pooled = [budget.take_stalled("a", 5), budget.take_stalled("a", 5)]
    assert not budget.stream_room("a") and budget.stream_room("b")
    with pytest.raises(QuotaExceeded, match="stopped reading") as refused, budget.stream("a"):
        pass
    assert refused.value.limit == "stall"
    budget.release_stalled("a", 5, pooled[0])  # it read (or cancelled) one of them
    assert budget.stream_room("a")
    budget.release_stalled("a", 5, pooled[1])
    assert (budget.held, budget.stalled, budget.held_by("a")) == (0, 0, 0)


def test_a_token_over_its_fair_share_is_outweighed_while_a_lighter_one_waits() -> None:
    async def run() -> None:
        budget = ReadBudget(bytes_per_token=60, total_bytes=100, wait_s=5)
        await budget.take("a", 60)
        await budget.take("b", 40)
        assert not budget.outweighed("a")  # nobody waits
        waiting = asyncio.ensure_future(budget.take("c", 10))
        await asyncio.sleep(0)
        # three tokens: a fair share is 33; a holds 60, b 40, and c (holding 0) waits
        assert budget.outweighed("a") and budget.outweighed("b")
        assert not budget.outweighed("c")
        budget.release("a", 60)  # c is served
        await asyncio.wait_for(waiting, 1)
        assert not budget.outweighed("b")

    asyncio.run(run())


def test_a_request_charge_waits_ahead_of_the_block_charges_already_waiting() -> None:
    async def run() -> None:
        budget = ReadBudget(bytes_per_token=100, total_bytes=100, wait_s=5)
        await budget.take("a", 95)
        block = asyncio.ensure_future(budget.take("b", 50))  # waits for the hub's room
        await asyncio.sleep(0)
        request = asyncio.ensure_future(budget.take("c", 10, ahead=True))
        await asyncio.sleep(0)
        assert not block.done() and not request.done()
        budget.release("a", 40)  # room for the request, not yet for the block
        await asyncio.wait_for(request, 1)
        assert not block.done()
        budget.release("a", 55)
        await asyncio.wait_for(block, 1)
        assert (budget.held_by("b"), budget.held_by("c"), budget.held) == (50, 10, 60)

    asyncio.run(run())


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_spoke_renewing_at_half_the_lifetime_is_never_refused() -> None:
    clock = Clock()
    limiter = GrantLimiter(120.0, holders=2, mono=clock)
    for _ in range(200):  # 100 lifetimes
        limiter.take("tok-1", b"spoke key")
        clock.now += 60.0  # spoke.mesh.grants.GrantKeeper: lifetime / 2
    assert limiter.live("tok-1") == 1


def test_a_token_gets_grants_for_a_bounded_number_of_keys_freed_after_a_lifetime() -> None:
    clock = Clock()
    limiter = GrantLimiter(120.0, holders=2, mono=clock)
    limiter.take("tok-1", b"k1")
    limiter.take("tok-1", b"k2")
    with pytest.raises(QuotaExceeded, match="--grant-holders-per-token 2") as refused:
        limiter.take("tok-1", b"k3")
    assert refused.value.limit == "grants"
    limiter.take("tok-2", b"k3")  # another token
    for _ in range(ISSUES_PER_HOLDER - 1):
        limiter.take("tok-1", b"k1")
    with pytest.raises(QuotaExceeded, match="within 120 s"):
        limiter.take("tok-1", b"k1")
    clock.now += 120.0
    limiter.take("tok-1", b"k3")  # k1 and k2 expired unrenewed
    assert limiter.live("tok-1") == 1
