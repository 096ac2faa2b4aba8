"""A fake of the scheduler's block source (what :class:`spoke.fetch.fetcher.Fetcher` reads
from: the hub, through :class:`spoke.hublink.source.HubSource`), for component tests of
the scheduler's users."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from spoke.errors import HubUnavailable
from spoke.fetch.scheduler import Priority


class DictSource:
    """Serves blocks from a dict and records every block it sends, in order.

    Args:
        blocks: digest -> bytes.
        delay: seconds each stream waits before its first block (a hub's answer).
    """

    name = "hub:0"

    def __init__(self, blocks: dict[str, bytes], delay: float = 0.0) -> None:
        self.blocks = blocks
        self.delay = delay
        self.fetched: list[str] = []
        self.down = 0  # streams that fail (a cut link) before one works

    async def read_blocks(
        self, blocks: Sequence[tuple[str, int]], timeout: float, priority: Priority
    ) -> AsyncIterator[tuple[str, bytes]]:
        digests = [d for d, _ in blocks]
        await asyncio.sleep(self.delay)
        if self.down:
            self.down -= 1
            raise HubUnavailable(f"{self.name} unavailable: link cut")
        for d in digests:
            self.fetched.append(d)
            await asyncio.sleep(0)
            yield d, self.blocks[d]
