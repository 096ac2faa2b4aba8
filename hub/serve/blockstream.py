"""The blocks of one ``ReadBlocks`` request, planned, charged, read and encoded.

:class:`BlockStreamer` turns a request's digests into the stream's messages for
:class:`hub.serve.service.HubService`: runs of blocks (one block, or a packed run of small ones),
each looked up in the catalog, charged to the caller's share of the read budget
(:mod:`hub.limits.budget`) before it is read, read whole from the blob store in a worker thread,
and encoded only as the previous message is sent. The next run is read while this one is
sent when the budget has room for both.

A stream's messages start small and grow (:class:`MessageRamp`: 64 KiB, then each twice
the one before, up to the chunk size), so a client that never reads stalls on a message
of 128 KiB or so rather than a whole chunk: what gRPC core keeps for it until it reads,
cancels or goes away is that message (:func:`hub.limits.budget.stalled_charge`), and the stall
deadline of a small message is short (:meth:`hub.limits.budget.ReadBudget.send_deadline`), so
its block's charge goes back within seconds. A client that reads pays four small messages
per request (under 1 MiB in all) before the chunks are full size.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from dataclasses import dataclass, field

from hub.catalog import Catalog
from hub.errors import BlockNotFound, CorruptBlob
from hub.limits.budget import ReadBudget, block_charge
from hub.serve.metrics import HubMetrics
from hub.serve.wire import encode_block_chunk, pack_into_first
from hub.store.blobstore import BlobStore
from protocol.hub.v1 import hub_pb2

MAX_DIGESTS_PER_REQUEST = 512
"""Most digests one ``ReadBlocksRequest`` may name (the spoke asks for 16 at a time); with
:data:`hub.serve.wire.MAX_REQUEST_BYTES` (a request of 512 is 17.4 KB)."""


FIRST_MESSAGE_BYTES = 64 * 1024
"""Data bytes of a stream's first message (:class:`MessageRamp`): what HTTP/2's default
stream window (65,535 bytes) and gRPC core's write buffer take from a client that has
read nothing yet."""


class MessageRamp:
    """The data sizes of one request's messages: :data:`FIRST_MESSAGE_BYTES`, then each
    twice the one before, up to ``most`` (the chunk size), bytes.

    Args:
        most: The largest size (positive).
    """

    __slots__ = ("_next", "most")

    def __init__(self, most: int) -> None:
        self.most = most
        self._next = min(FIRST_MESSAGE_BYTES, most)

    def peek(self, after: int = 0) -> int:
        """The size of the message ``after`` messages from the next, without taking any."""
        return min(self._next << after, self.most)

    def take(self) -> int:
        """The next message's size; the one after is twice it (at most :attr:`most`)."""
        size = self._next
        self._next = min(2 * size, self.most)
        return size


PACK_MOST_BLOCKS = 256
"""Most blocks packed into one ``ReadBlocks`` message (``ReadBlocksRequest.pack_bytes``);
a 1 MiB message of 4 KiB blocks."""


class PackedDigests(Sequence[str]):
    """A request's digests, 16 bytes each instead of a str object (81 bytes) each: what a
    stream holds while it waits for room (:mod:`hub.limits.budget`)."""

    __slots__ = ("_packed",)

    def __init__(self, digests: Sequence[str]) -> None:
        self._packed = bytes.fromhex("".join(digests))

    def __len__(self) -> int:
        return len(self._packed) // 16

    def __getitem__(self, index: int) -> str:  # type: ignore[override]
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self._packed[index * 16 : index * 16 + 16].hex()


@dataclass(slots=True)
class BlockRun:
    """Blocks sent together: one block, or a packed run of small ones (``packed``).

    Attributes:
        blocks: ``(digest, size)`` in order.
        packed: Whether they go as one packed message.
        end: The index after the run in the request's digests.
        size: Their bytes.
        charge: What the run is charged in the read budget (:func:`hub.limits.budget.block_charge`).
        data: Their bytes once read.
    """

    blocks: list[tuple[str, int]]
    packed: bool
    end: int
    size: int
    charge: int
    data: list[bytes] = field(default_factory=list)


class BlockStreamer:
    """Streams the blocks a request names, in order, within the read budget.

    Args:
        catalog: Where block sizes and who may read them are looked up.
        store: Where the blocks are.
        budget: Bytes in flight per token and in total (:mod:`hub.limits.budget`).
        metrics: ``blocks_served`` and ``blocks_served_bytes`` are counted here.
        chunk_bytes: Largest ``BlockChunk.data``, bytes (positive).
    """

    def __init__(
        self,
        catalog: Catalog,
        store: BlobStore,
        budget: ReadBudget,
        metrics: HubMetrics,
        chunk_bytes: int,
    ) -> None:
        self._catalog = catalog
        self._store = store
        self._budget = budget
        self._metrics = metrics
        self._chunk_bytes = chunk_bytes

    def plan_run(
        self,
        digests: Sequence[str],
        start: int,
        readable: Callable[[str], bool] | None,
        pack_bytes: int,
    ) -> BlockRun:
        """Looks up ``digests[start]`` and, with ``pack_bytes``, the blocks after it that
        fit in one message with it; runs in a worker thread (one hop for the run).

        A run of whole one-chunk blocks totalling at most ``pack_bytes`` data bytes
        (at most :data:`PACK_MOST_BLOCKS`) becomes one message: the first block's
        ``BlockChunk`` with the others in its ``more`` (:func:`pack_into_first`).
        Nothing is read yet: the run is charged to the budget first.

        Raises:
            BlockNotFound: ``digests[start]`` is unknown (or unreadable by this caller); a
                later one ends the run and fails on its own turn.
        """
        size = self._catalog.block_size(digests[start], readable)
        if size is None:
            raise BlockNotFound(f"unknown block {digests[start]}")
        blocks = [(digests[start], size)]
        packed = bool(pack_bytes) and 0 < size <= min(pack_bytes, self._chunk_bytes)
        total, end = size, start + 1
        while packed and end < len(digests) and end - start < PACK_MOST_BLOCKS:
            next_size = self._catalog.block_size(digests[end], readable)
            if next_size is None or total + next_size > pack_bytes:
                break  # an unknown one fails on its own turn, after what came before
            blocks.append((digests[end], next_size))
            total += next_size
            end += 1
        charge = block_charge(total, self._chunk_bytes) + (total if packed else 0)
        return BlockRun(blocks, packed, end, total, charge)

    def read_run(self, run: BlockRun) -> None:
        """Reads a planned run's blocks whole (one request to the store each, so the
        kernel's readahead or one ranged GET covers a block); in a worker thread.

        Raises:
            CorruptBlob: the stored bytes have the wrong length.
        """
        for digest, size in run.blocks:
            data = self._store.read(digest)
            if len(data) != size:
                raise CorruptBlob(f"block {digest} has {len(data)} bytes, not {size}")
            run.data.append(data)

    async def load_run(
        self,
        digests: Sequence[str],
        start: int,
        readable: Callable[[str], bool] | None,
        pack_bytes: int,
        who: str,
        wait: bool,
    ) -> BlockRun | None:
        """Plans the run at ``start``, charges it to ``who`` (waiting for room, or with
        ``wait`` false giving up at once: None) and reads it."""
        run = await asyncio.to_thread(self.plan_run, digests, start, readable, pack_bytes)
        if wait:
            await self._budget.take(who, run.charge)
        elif not self._budget.try_take(who, run.charge):
            return None
        try:
            await asyncio.to_thread(self.read_run, run)
        except BaseException:
            self._budget.release(who, run.charge)
            raise
        return run

    def run_messages(self, run: BlockRun, ramp: MessageRamp | None = None) -> Iterator[bytes]:
        """A run's messages, each encoded only when the previous one has been sent
        (:func:`encode_block_chunk` from a view of the block: one copy besides the read);
        a block's chunks are sized by ``ramp`` (full chunks without one)."""
        ramp = ramp or MessageRamp(self._chunk_bytes)
        if run.packed:
            messages = [
                encode_block_chunk(digest, 0, data, size, True)
                for (digest, size), data in zip(run.blocks, run.data, strict=True)
            ]
            ramp.take()
            yield pack_into_first(messages, hub_pb2.BlockChunk.MORE_FIELD_NUMBER)
            return
        (digest, size), data = run.blocks[0], run.data[0]
        view = memoryview(data)
        offset = 0
        while offset < size:
            step = ramp.take()
            yield encode_block_chunk(
                digest, offset, view[offset : offset + step], size, offset + step >= size
            )
            offset += step

    async def messages(
        self,
        digests: Sequence[str],
        readable: Callable[[str], bool] | None,
        pack_bytes: int,
        who: str,
    ) -> AsyncGenerator[bytes, None]:
        """Streams blocks in order, each charged to ``who`` while it is held; the next
        run is read while this one is being sent when the budget has room for both. The
        messages grow from :data:`FIRST_MESSAGE_BYTES` to the chunk size
        (:class:`MessageRamp`), packed runs with them."""
        if not digests:
            return
        load = self.load_run
        ramp = MessageRamp(self._chunk_bytes)
        pending: asyncio.Future[BlockRun | None] | None = None
        start = 0
        try:
            while start < len(digests):
                run = await pending if pending is not None else None
                pending = None
                if run is None:
                    packing = min(pack_bytes, ramp.peek())
                    run = await load(digests, start, readable, packing, who, True)
                    assert run is not None  # a waiting load charges or raises
                try:
                    if run.end < len(digests):
                        # read ahead: it follows at least this run's first message
                        packing = min(pack_bytes, ramp.peek(after=1))
                        pending = asyncio.ensure_future(
                            load(digests, run.end, readable, packing, who, False)
                        )
                    for message in self.run_messages(run, ramp):
                        yield message
                finally:
                    run.data.clear()
                    self._budget.release(who, run.charge)
                self._metrics.blocks_served_bytes.inc(run.size)
                self._metrics.blocks_served.inc(run.end - start)
                start = run.end
        finally:
            if pending is not None:
                pending.cancel()
                with contextlib.suppress(BaseException):
                    ahead = await pending
                    if ahead is not None:
                        self._budget.release(who, ahead.charge)
