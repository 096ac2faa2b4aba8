"""Receiving request messages (hub.serve.inbound): charged while they arrive, within a deadline;
a stream's later message is never held up for room."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from hub.errors import QuotaExceeded
from hub.limits.budget import ReadBudget
from hub.serve.inbound import receive
from hub.serve.wire import CORE_REQUEST_BYTES


async def _slow(message: str, delay: float) -> AsyncIterator[str]:
    await asyncio.sleep(delay)
    yield message


def test_a_message_is_charged_while_it_arrives_and_released_after() -> None:
    async def run() -> None:
        budget = ReadBudget(wait_s=5)
        task = asyncio.ensure_future(receive(_slow("m", 0.05), budget, "a"))
        await asyncio.sleep(0.01)
        assert budget.held_by("a") == CORE_REQUEST_BYTES
        assert await task == "m"
        assert budget.held == 0

    asyncio.run(run())


def test_a_message_that_does_not_come_in_time_is_refused_as_a_request_limit() -> None:
    async def run() -> None:
        budget = ReadBudget(wait_s=5)
        with pytest.raises(QuotaExceeded, match=r"no request message within 0\.05 s") as late:
            await receive(_slow("m", 5), budget, "a", wait_s=0.05)
        assert late.value.limit == "request" and budget.held == 0

    asyncio.run(run())


def test_a_first_message_waits_for_room_and_a_later_one_is_taken_uncharged() -> None:
    async def run() -> None:
        budget = ReadBudget(bytes_per_token=1 << 20, total_bytes=1 << 20, wait_s=0.05)
        await budget.take("other", 1 << 20)  # the hub is full
        with pytest.raises(QuotaExceeded, match="no room"):
            await receive(_slow("m", 0), budget, "a")
        assert await receive(_slow("m", 0), budget, "a", first=False) == "m"
        assert budget.held == 1 << 20

    asyncio.run(run())
