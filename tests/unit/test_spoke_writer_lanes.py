"""The block writer's lanes (spoke.cache.writer): a write a reader waits for is never
queued behind other writes' batches (issue 39's eighteenth probe, measured again: another
tenant's demand misses waited p50 0.15 s between arrival and residence behind a prewarm's
writes)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path

from spoke.cache.store import BlockStore, Received, open_index
from spoke.cache.writer import BlockWriter
from spoke.disk.layout import CacheLayout, block_digest


class GatedStore(BlockStore):
    """A real store whose batches holding ``gated`` wait for ``gate`` in their thread."""

    def __init__(self, layout: CacheLayout) -> None:
        super().__init__(layout, open_index(layout))
        self.gated: set[str] = set()
        self.gate = threading.Event()
        self.batches: list[list[str]] = []

    def write_many(self, blocks: Sequence[tuple[str, Received, int]]) -> list[OSError | None]:
        self.batches.append([d for d, _, _ in blocks])
        if any(d in self.gated for d, _, _ in blocks):
            assert self.gate.wait(10), "the gated batch was never let go"
        return super().write_many(blocks)


def _block(i: int) -> tuple[str, bytes]:
    data = f"block {i} ".encode().ljust(4096, b".")
    return block_digest(data), data


def test_an_urgent_write_lands_while_other_batches_wait(tmp_path: Path) -> None:
    store = GatedStore(CacheLayout(tmp_path / "cache"))
    writer = BlockWriter(store, most_blocks=4)
    ahead = [_block(i) for i in range(12)]
    urgent = _block(99)
    store.gated.add(ahead[0][0])

    async def go() -> None:
        others = [asyncio.create_task(writer.write(d, b, 1)) for d, b in ahead]
        try:
            await asyncio.sleep(0.05)  # the first batch is in its thread, held; 8 queued
            await asyncio.wait_for(writer.write(*urgent, 2, urgent=True), 5)
            assert store.read(urgent[0]) == urgent[1]
            assert not any(t.done() for t in others)  # every other write still waits
        finally:
            store.gate.set()
        await asyncio.gather(*others)

    asyncio.run(go())
    assert all(store.read(d) == b for d, b in ahead)
    assert [urgent[0]] in store.batches  # a batch of its own, not behind the others
    assert [len(b) for b in store.batches if b != [urgent[0]]] == [4, 4, 4]
