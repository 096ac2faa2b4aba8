"""What the hub's gRPC service tests (``tests/integration/test_hub_service*.py``) share: the
datasets one module's hub serves (``f3`` in two versions of small blocks, ``big`` of one
3 MiB block, ``many`` and ``deep`` of hundreds of files), that hub on loopback with a
blocking client (:class:`Hub`; the ``hub`` and ``metrics`` fixtures: import
``hub_fixture`` and ``metrics_fixture`` to use them), and a file read back from its blocks
(:func:`reassemble`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from hub.publish.tree import publish
from hub.serve.config import MAX_MESSAGE_BYTES
from hub.serve.metrics import HubMetrics
from hub.serve.serverthread import ServerThread
from hub.snapshot.blocks import MiB, block_digest
from protocol.hub.v1 import hub_pb2, hub_pb2_grpc

BLOCK = 1000
BIG_BLOCK = 3 * MiB
RPC_TIMEOUT = 10.0
MANY_FILES = 700  # several GetManifest pages
DEEP_FILES = 600
DEEP_DIR = "/".join(c * 240 for c in "abcd")  # entries of ~1 KB paths


def make_tree(root: Path) -> dict[str, bytes]:
    """Several files (one spanning many blocks, one empty), a nested dir, a symlink."""
    files = {
        "README.txt": b"seismic volume f3\n",
        "volume/data.bin": os.urandom(5 * BLOCK + 123),
        "volume/empty": b"",
        "volume/meta/zarr.json": b'{"zarr_format": 3}',
        "zeros.bin": bytes(3 * BLOCK),  # three equal blocks
    }
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    (root / "volume" / "empty-dir").mkdir()
    (root / "current").symlink_to("volume/data.bin")
    return files


class Hub:
    """A running hub with its data and a client stub."""

    def __init__(self, data: Path, src: Path, files: dict[str, bytes], port: int) -> None:
        self.data = data
        self.src = src
        self.files = files
        self.channel = grpc.insecure_channel(
            f"127.0.0.1:{port}",
            options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)],
        )
        self.stub = hub_pb2_grpc.HubStub(self.channel)

    def read_blocks(self, *requests: list[str]) -> list[hub_pb2.BlockChunk]:
        messages = [hub_pb2.ReadBlocksRequest(digests=digests) for digests in requests]
        return list(self.stub.ReadBlocks(iter(messages), timeout=RPC_TIMEOUT))

    def manifest(self, ref: str = "latest") -> list[hub_pb2.ManifestEntry]:
        request = hub_pb2.GetManifestRequest(dataset="f3", ref=ref)
        return list(self.stub.GetManifest(request, timeout=RPC_TIMEOUT))


@pytest.fixture(scope="module", name="metrics")
def metrics_fixture() -> HubMetrics:
    return HubMetrics()


@pytest.fixture(scope="module", name="hub")
def hub_fixture(tmp_path_factory: pytest.TempPathFactory, metrics: HubMetrics) -> Iterator[Hub]:
    base = tmp_path_factory.mktemp("hub")
    src = base / "src"
    src.mkdir()
    files = make_tree(src)
    data = base / "data"
    publish(data, "f3", src, block_size=BLOCK)
    (src / "README.txt").write_bytes(b"seismic volume f3, second edition\n")
    publish(data, "f3", src, block_size=BLOCK)
    files["README.txt"] = (src / "README.txt").read_bytes()
    big = base / "big"
    big.mkdir()
    (big / "block.bin").write_bytes(os.urandom(BIG_BLOCK + 5))
    publish(data, "big", big, block_size=BIG_BLOCK)
    many = base / "many"
    many.mkdir()
    for i in range(MANY_FILES):
        (many / f"f{i:04d}").write_bytes(str(i).encode())
    publish(data, "many", many)
    deep = base / "deep" / DEEP_DIR
    deep.mkdir(parents=True)
    for i in range(DEEP_FILES):
        (deep / f"f{i:04d}").write_bytes(str(i).encode())
    publish(data, "deep", base / "deep")
    with ServerThread(data, "127.0.0.1:0", metrics=metrics) as server:
        client = Hub(data, src, files, server.port)
        yield client
        client.channel.close()


def reassemble(hub: Hub, entry: hub_pb2.ManifestEntry) -> bytes:
    chunks = hub.read_blocks([block.digest for block in entry.blocks])
    blocks: list[bytes] = []
    current = b""
    for chunk in chunks:
        assert chunk.offset == len(current)
        current += chunk.data
        if chunk.last:
            assert len(current) == chunk.block_size
            assert block_digest(current) == chunk.digest
            blocks.append(current)
            current = b""
    assert current == b""
    assert [block_digest(b) for b in blocks] == [block.digest for block in entry.blocks]
    return b"".join(blocks)
