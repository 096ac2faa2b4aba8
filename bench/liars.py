"""Peers that lie, for the benchmark and the tests that hold a spoke to what it accepts
from its mesh: one fake ``SpokePeer`` that answers probes as the node it stands in for and
every block request in one way named by ``how``:

- ``flood``: endless 4 MiB chunks of the first block asked for, never marked last
  (``python -m bench.peer_flood`` measures the victim under it);
- ``longer``: the right size announced, more bytes sent;
- ``shorter``: fewer bytes than the block, marked last;
- ``other size``: one chunk announcing (and carrying) a size one byte larger;
- ``flipped``: every block asked for, read from the hub, its first byte flipped (the
  right length, the wrong bytes: a digest check is all that catches it).

:func:`memory` reads what the victim daemon holds meanwhile. Tests import it from here
(tests may import bench; bench never imports tests).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Literal

from protocol.hub.v1 import hub_pb2
from protocol.spoke.v1 import peer_pb2, peer_pb2_grpc
from spoke.hublink.client import HubClient

FLOOD_CHUNK = 4 << 20
"""Bytes in each of a flood's chunks."""

How = Literal["flood", "longer", "shorter", "other size", "flipped"]


class Liar(peer_pb2_grpc.SpokePeerServicer):
    """Answers probes as ``node`` and every block request in the way named ``how``.

    Args:
        node: the ``HOST:PORT`` it answers probes as.
        how: how it lies (the module's list).
        hub: the hub's ``HOST:PORT``, where ``flipped`` reads the bytes it spoils.
    """

    def __init__(self, node: str, how: How, hub: str | None = None) -> None:
        if how == "flipped" and hub is None:
            raise ValueError("a flipped-bytes liar reads from a hub: give hub")
        self.node = node
        self.how = how
        self.hub = hub
        self.sent = 0  # bytes yielded
        self.blocks = 0  # blocks answered (flipped)

    async def Probe(self, request: object, context: object) -> peer_pb2.ProbeResponse:
        return peer_pb2.ProbeResponse(node=self.node)

    async def ReadBlocks(
        self, request_iterator: AsyncIterator[peer_pb2.PeerReadRequest], context: object
    ) -> AsyncIterator[hub_pb2.BlockChunk]:
        if self.how == "flipped":
            async for chunk in self._flipped(request_iterator):
                yield chunk
            return
        async for request in request_iterator:
            block = request.blocks[0]
            for offset, data, last, size in self._chunks(block.size):
                self.sent += len(data)
                yield hub_pb2.BlockChunk(
                    digest=block.digest, offset=offset, data=data, block_size=size, last=last
                )

    def _chunks(self, size: int) -> Iterator[tuple[int, bytes, bool, int]]:
        if self.how == "flood":  # endless, never last
            offset = 0
            chunk = bytes(FLOOD_CHUNK)
            while True:
                yield offset, chunk, False, size
                offset += FLOOD_CHUNK
        elif self.how == "longer":  # the right size announced, more bytes sent
            yield 0, bytes(200_000), False, size
            yield 200_000, bytes(200_000), True, size
        elif self.how == "shorter":
            yield 0, bytes(100_000), True, size
        elif self.how == "other size":
            yield 0, bytes(size + 1), True, size + 1

    async def _flipped(
        self, request_iterator: AsyncIterator[peer_pb2.PeerReadRequest]
    ) -> AsyncIterator[hub_pb2.BlockChunk]:
        assert self.hub is not None
        hub = HubClient(self.hub)
        try:
            async for request in request_iterator:
                digests = [b.digest for b in request.blocks]
                async for digest, data in hub.read_blocks(digests, 30):
                    bad = bytes([data[0] ^ 0xFF]) + data[1:]
                    self.sent += len(bad)
                    self.blocks += 1
                    yield hub_pb2.BlockChunk(
                        digest=digest, offset=0, data=bad, block_size=len(bad), last=True
                    )
        finally:
            await hub.close()


class Stall(peer_pb2_grpc.SpokePeerServicer):
    """A peer that answers probes and never sends a block (a stalled owner or relay)."""

    def __init__(self, node: str) -> None:
        self.node = node

    async def Probe(self, request: object, context: object) -> peer_pb2.ProbeResponse:
        return peer_pb2.ProbeResponse(node=self.node)

    async def ReadBlocks(
        self, request_iterator: object, context: object
    ) -> AsyncIterator[hub_pb2.BlockChunk]:
        await asyncio.sleep(3600)  # the stall itself: never sends
        yield hub_pb2.BlockChunk()


def memory(pid: int) -> tuple[int, int]:
    """Resident and peak resident memory of ``pid`` (``VmRSS``, ``VmHWM``), bytes."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]
