"""hub.limits.streams.StreamSlots: per-token and total caps, waiting in order, bounded waiters."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from hub.errors import QuotaExceeded
from hub.limits.slots import RESERVED_BELOW
from hub.limits.streams import TOKEN_SHARE, WAITING_PER_SLOT, StreamSlots


def test_a_token_holds_at_most_its_share_and_is_refused_at_once_without_a_wait() -> None:
    async def go() -> None:
        slots = StreamSlots("Watch", "--max-watch-streams", 8 * TOKEN_SHARE)
        async with contextlib.AsyncExitStack() as stack:
            for _ in range(slots.per_token):
                await stack.enter_async_context(slots.slot("a"))
            with pytest.raises(
                QuotaExceeded, match=r"at most 64 \(--max-watch-streams\), 8 per token"
            ) as refused:
                await stack.enter_async_context(slots.slot("a"))
            assert refused.value.limit == "streams"
            await stack.enter_async_context(slots.slot("b"))  # another token is not held up
            assert (slots.open, slots.open_by("a"), slots.open_by("b")) == (9, 8, 1)
        assert slots.open == 0 and slots.open_by("a") == 0

    asyncio.run(go())


def test_the_total_is_shared_by_every_token() -> None:
    async def go() -> None:
        slots = StreamSlots("Watch", "--max-watch-streams", TOKEN_SHARE)  # one per token
        async with contextlib.AsyncExitStack() as stack:
            for i in range(TOKEN_SHARE):
                await stack.enter_async_context(slots.slot(f"t{i}"))
            with pytest.raises(QuotaExceeded):
                await stack.enter_async_context(slots.slot("late"))

    asyncio.run(go())


def test_tokens_at_their_share_leave_the_last_eighth_to_tokens_holding_few() -> None:
    """Eight tokens at their eighth each would fill the unary calls' 4,096 (issue 39's
    re-probe): seven fill all but the last 512, which stay for tokens holding fewer than
    16 — the eighth token gets 16, and so does each newcomer after it."""

    async def go() -> None:
        slots = StreamSlots("unary", "--max-unary-calls", 4096)
        async with contextlib.AsyncExitStack() as stack:
            for i in range(TOKEN_SHARE):
                with contextlib.suppress(QuotaExceeded):
                    while True:
                        await stack.enter_async_context(slots.slot(f"t{i}"))
            assert [slots.open_by(f"t{i}") for i in range(TOKEN_SHARE)] == [512] * 7 + [
                RESERVED_BELOW
            ]
            with pytest.raises(QuotaExceeded, match="the last 512 for tokens holding fewer"):
                await stack.enter_async_context(slots.slot("t0"))
            for _ in range(RESERVED_BELOW):
                await stack.enter_async_context(slots.slot("newcomer"))
            assert slots.open == 3584 + 2 * RESERVED_BELOW
        assert slots.open == 0

    asyncio.run(go())


def test_a_kind_whose_share_is_small_keeps_its_reserve_for_tokens_holding_few() -> None:
    """ListDirectory's share is 16 of 128: with a reserve threshold of 16 every token
    under its share could take the reserve, and eight tokens took all 128 (issue 39's
    second re-probe); a token holding a quarter of its share (4) no longer may."""

    async def go() -> None:
        slots = StreamSlots("ListDirectory", "LISTING_CALLS", 128)
        async with contextlib.AsyncExitStack() as stack:
            for i in range(TOKEN_SHARE):
                with contextlib.suppress(QuotaExceeded):
                    while True:
                        await stack.enter_async_context(slots.slot(f"t{i}"))
            assert [slots.open_by(f"t{i}") for i in range(TOKEN_SHARE)] == [16] * 7 + [4]
            for _ in range(4):
                await stack.enter_async_context(slots.slot("newcomer"))
            with pytest.raises(QuotaExceeded, match="for tokens holding fewer than 4"):
                await stack.enter_async_context(slots.slot("newcomer"))

    asyncio.run(go())


def test_a_reply_left_unread_stops_holding_the_total_but_not_its_tokens_share() -> None:
    """A client that never opens its window held a unary slot of everyone's until it went
    away (issue 39's second re-probe); past hub.limits.streams.REPLY_S it counts only against
    its own token's share."""

    async def go() -> None:
        slots = StreamSlots("ListDirectory", "LISTING_CALLS", 128)
        for i in range(TOKEN_SHARE + 4):  # seven tokens at their share, then the reserve
            with contextlib.suppress(QuotaExceeded):
                for _ in range(slots.per_token):
                    await slots.acquire(f"t{i}")
        assert slots.open == slots.total
        pinned = [(f"t{i}", slots.open_by(f"t{i}")) for i in range(TOKEN_SHARE + 4)]
        with pytest.raises(QuotaExceeded):
            await slots.acquire("late")
        for name, count in pinned:  # every reply waited REPLY_S
            for _ in range(count):
                slots.unhold(name)
        assert slots.open == 0
        await slots.acquire("late")  # another token gets in
        with pytest.raises(QuotaExceeded):
            await slots.acquire("t0")  # t0's unread replies still fill its own share
        for name, count in pinned:  # the clients go away
            for _ in range(count):
                slots.release(name, held=False)
        slots.release("late")
        assert slots.open == 0 and slots.open_by("t0") == 0
        # and for PENALTY_S after, a token whose reply went unread holds few of that kind
        # (issue 39's fourth probe re-pinned every slot right after the 30 s)
        for _ in range(4):
            await slots.acquire("t0")
        with pytest.raises(QuotaExceeded):
            await slots.acquire("t0")
        for _ in range(16):
            await slots.acquire("late")  # a token without that past holds its share

    asyncio.run(go())


def test_slots_out_of_the_total_are_a_pool_of_the_total_at_most() -> None:
    """Unread replies leave the hub's total at most ``total`` at a time: colluding tokens
    in waves (issue 39's fifth probe: 24 tokens, 3.7 GiB) cannot grow what unread replies
    hold past twice the kind's slots; beyond the pool a slot stays in the total."""

    async def go() -> None:
        slots = StreamSlots("ListDirectory", "LISTING_CALLS", 16)
        waves = [[f"w{w}t{t}" for t in range(16)] for w in range(2)]  # a slot each
        for name in waves[0]:
            await slots.acquire(name)
        assert slots.open == slots.total
        assert all([slots.unhold(name) for name in waves[0]]) and slots.open == 0
        assert slots.unheld == slots.total
        third = waves[1][0]
        await slots.acquire(third)
        assert slots.unhold(third) is False  # the pool is full: it stays in the total
        assert slots.open == 1 and slots.unheld == slots.total
        slots.release(waves[0][0], held=False)  # one unread reply's client goes away
        assert slots.unheld == slots.total - 1
        fourth = waves[1][1]
        await slots.acquire(fourth)
        assert slots.unhold(fourth) is True  # room in the pool again
        slots.release(third)
        slots.release(fourth, held=False)
        assert slots.open == 0 and slots.unheld == slots.total - 1

    asyncio.run(go())


def test_a_waiting_stream_gets_the_slot_freed_and_times_out_without_one() -> None:
    async def go() -> None:
        slots = StreamSlots("GetManifest", "--max-manifest-streams", TOKEN_SHARE, wait_s=5)
        freed = asyncio.Event()

        async def holder() -> None:
            async with slots.slot("a"):
                await freed.wait()

        first = asyncio.create_task(holder())
        await asyncio.sleep(0)
        got = asyncio.Event()

        async def waiter() -> None:
            async with slots.slot("a"):
                got.set()

        second = asyncio.create_task(waiter())
        await asyncio.sleep(0.01)
        assert not got.is_set()  # waits: the token's one slot is held
        freed.set()
        await asyncio.wait_for(asyncio.gather(first, second), 5)
        assert got.is_set() and slots.open == 0

        quick = StreamSlots("GetManifest", "--max-manifest-streams", TOKEN_SHARE, wait_s=0.05)
        async with quick.slot("a"):
            with pytest.raises(QuotaExceeded, match="1 for token a"):
                async with quick.slot("a"):
                    pass  # pragma: no cover (refused)
        assert quick.open == 0

    asyncio.run(go())


def test_a_token_may_have_only_so_many_streams_waiting() -> None:
    async def go() -> None:
        slots = StreamSlots("GetManifest", "--max-manifest-streams", TOKEN_SHARE, wait_s=30)
        release = asyncio.Event()

        async def hold() -> None:
            async with slots.slot("a"):
                await release.wait()

        tasks = [asyncio.create_task(hold()) for _ in range(1 + WAITING_PER_SLOT)]
        await asyncio.sleep(0.01)  # one holds the slot, WAITING_PER_SLOT wait
        with pytest.raises(QuotaExceeded):
            async with slots.slot("a"):
                pass  # pragma: no cover (refused)
        release.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        assert slots.open == 0

    asyncio.run(go())
