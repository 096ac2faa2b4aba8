"""The spoke's hub client asks for packed blocks and manifest pages (issue 12): what it
hands on is the same, block for block and entry for entry, as one message each."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from hub.publish.tree import publish
from hub.serve.serverthread import ServerThread
from hub.snapshot.blocks import MiB, block_digest
from protocol.hub.v1 import hub_pb2
from spoke.hublink.client import PAGE_ENTRIES, HubClient

FILES = 3 * PAGE_ENTRIES + 17


def test_paged_manifest_and_packed_blocks_arrive_whole_and_in_order(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    contents = {f"f{i:04d}": os.urandom(1 + i * 97 % 5000) for i in range(FILES)}
    contents["big.bin"] = os.urandom(3 * MiB + 5)  # blocks larger than a packed message
    for name, data in contents.items():
        (src / name).write_bytes(data)
    publish(tmp_path / "data", "ds", src, block_size=2 * MiB)
    with ServerThread(tmp_path / "data") as server:

        async def go() -> tuple[list[hub_pb2.ManifestEntry], list[tuple[str, bytes]]]:
            client = HubClient(f"127.0.0.1:{server.port}")
            try:
                entries = await client.get_manifest("ds", "latest")
                digests = [b.digest for e in entries for b in e.blocks]
                blocks = [item async for item in client.read_blocks(digests, timeout=30)]
                return entries, blocks
            finally:
                await client.close()

        entries, blocks = asyncio.run(go())
    assert [e.path for e in entries] == sorted(contents)
    assert all(not e.more for e in entries)  # pages are flattened, never handed on
    assert [d for d, _ in blocks] == [b.digest for e in entries for b in e.blocks]
    assert all(block_digest(data) == digest for digest, data in blocks)
    by_path: dict[str, bytes] = {}
    position = 0
    for entry in entries:
        count = len(entry.blocks)
        by_path[entry.path] = b"".join(data for _, data in blocks[position : position + count])
        position += count
    assert by_path == contents
