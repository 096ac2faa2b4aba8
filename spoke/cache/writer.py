"""Block file writes off the event loop, batched: :class:`BlockWriter`."""

from __future__ import annotations

import asyncio

from spoke.cache.store import BlockStore, Received


class BlockWriter:
    """Writes blocks for the event loop in batches, in a worker thread.

    One :meth:`write` alone is one :meth:`BlockStore.write_many` call of one block; while
    a batch is being written, later writes queue up and go together in the next batch
    (at most ``most_blocks`` blocks or ``most_bytes`` bytes). Under load that turns a
    thread hand-off and an index commit per block into one per batch: with 64 KiB blocks
    the per-block cost of the hand-off (GIL contention with the loop) was what limited
    prewarm.

    Args:
        store: where blocks go.
        most_blocks, most_bytes: the largest batch.
    """

    def __init__(self, store: BlockStore, most_blocks: int = 64, most_bytes: int = 64 << 20):
        self._store = store
        self._most_blocks = most_blocks
        self._most_bytes = most_bytes
        self._queue: list[tuple[str, Received, int, asyncio.Future[None]]] = []
        self._task: asyncio.Task[None] | None = None

    async def write(self, digest: str, data: Received, tick: int) -> None:
        """Store a verified block (as :meth:`BlockStore.write`), batched with others.

        Raises:
            OSError: the cache filesystem refused this block (e.g. ENOSPC).
            lmdb.Error: the index commit of its batch failed.
        """
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((digest, data, tick, future))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain())
        await future

    async def _drain(self) -> None:
        while self._queue:
            size = count = 0
            for _digest, data, _tick, _future in self._queue:
                if count and (count >= self._most_blocks or size + len(data) > self._most_bytes):
                    break
                count += 1
                size += len(data)
            batch, self._queue = self._queue[:count], self._queue[count:]
            try:
                errors = await asyncio.to_thread(
                    self._store.write_many, [(d, b, t) for d, b, t, _ in batch]
                )
            except asyncio.CancelledError:
                for *_, future in batch + self._queue:
                    future.cancel()
                self._queue = []
                raise
            except Exception as err:
                for *_, future in batch:
                    if not future.done():
                        future.set_exception(err)
                continue
            for (*_, future), error in zip(batch, errors, strict=True):
                if future.done():
                    continue
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)
