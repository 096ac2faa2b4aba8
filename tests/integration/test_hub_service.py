"""The hub's gRPC service on loopback: a real grpc.aio server, a blocking client."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from hub.publish.tree import publish
from hub.serve.config import MAX_MESSAGE_BYTES
from hub.serve.metrics import HubMetrics
from hub.serve.serverthread import ServerThread
from hub.serve.service import LISTING_REPLY_BYTES
from hub.serve.wire import MANIFEST_MESSAGE_BYTES
from hub.snapshot.blocks import MiB, block_digest
from protocol.hub.v1 import hub_pb2, hub_pb2_grpc

REPO_ROOT = Path(__file__).resolve().parents[2]
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


@pytest.fixture(scope="module")
def metrics() -> HubMetrics:
    return HubMetrics()


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory, metrics: HubMetrics) -> Iterator[Hub]:
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


def test_list_datasets(hub: Hub) -> None:
    response = hub.stub.ListDatasets(hub_pb2.ListDatasetsRequest(), timeout=RPC_TIMEOUT)
    by_name = {d.name: d for d in response.datasets}
    assert by_name["f3"].version_count == 2
    assert by_name["f3"].latest_version == "v2"
    assert by_name["big"].latest_version == "v1"


def test_list_versions(hub: Hub) -> None:
    response = hub.stub.ListVersions(hub_pb2.ListVersionsRequest(dataset="f3"), timeout=RPC_TIMEOUT)
    assert [v.version for v in response.versions] == ["v1", "v2"]
    assert [(t.name, t.version) for t in response.tags] == [("latest", "v2")]
    v1, v2 = response.versions
    assert v1.snapshot_id != v2.snapshot_id
    assert v1.created_ns <= v2.created_ns
    assert v2.block_size == BLOCK
    assert v2.file_count == 5
    assert v2.total_bytes == sum(len(content) for content in hub.files.values())


def test_resolve_ref_by_tag_and_version(hub: Hub) -> None:
    latest = hub.stub.ResolveRef(
        hub_pb2.ResolveRefRequest(dataset="f3", ref="latest"), timeout=RPC_TIMEOUT
    )
    v2 = hub.stub.ResolveRef(hub_pb2.ResolveRefRequest(dataset="f3", ref="v2"), timeout=RPC_TIMEOUT)
    v1 = hub.stub.ResolveRef(hub_pb2.ResolveRefRequest(dataset="f3", ref="v1"), timeout=RPC_TIMEOUT)
    assert latest == v2
    assert (v2.dataset, v2.version) == ("f3", "v2")
    assert len(v2.snapshot_id) == 32
    assert v1.snapshot_id != v2.snapshot_id


def test_manifest_order_and_fields(hub: Hub) -> None:
    entries = hub.manifest()
    paths = [e.path for e in entries]
    assert paths == sorted(paths)
    assert paths == [
        "README.txt",
        "current",
        "volume",
        "volume/data.bin",
        "volume/empty",
        "volume/empty-dir",
        "volume/meta",
        "volume/meta/zarr.json",
        "zeros.bin",
    ]
    by_path = {e.path: e for e in entries}
    data = by_path["volume/data.bin"]
    st = (hub.src / "volume" / "data.bin").stat()
    assert data.type == hub_pb2.ENTRY_TYPE_FILE
    assert data.size == len(hub.files["volume/data.bin"])
    assert data.mode == st.st_mode & 0o7777
    assert data.mtime_ns == st.st_mtime_ns
    assert [b.size for b in data.blocks] == [BLOCK] * 5 + [123]
    assert by_path["volume/empty"].blocks == []
    assert by_path["volume/empty"].size == 0
    link = by_path["current"]
    assert link.type == hub_pb2.ENTRY_TYPE_SYMLINK
    assert link.symlink_target == "volume/data.bin"
    assert link.blocks == []
    assert by_path["volume/empty-dir"].type == hub_pb2.ENTRY_TYPE_DIRECTORY
    assert by_path["volume/empty-dir"].size == 0


def test_long_manifest_streams_completely_in_order(hub: Hub) -> None:
    request = hub_pb2.GetManifestRequest(dataset="many", ref="v1")
    entries = list(hub.stub.GetManifest(request, timeout=RPC_TIMEOUT))
    assert [e.path for e in entries] == [f"f{i:04d}" for i in range(MANY_FILES)]
    assert reassemble(hub, entries[-1]) == str(MANY_FILES - 1).encode()


def test_old_versions_keep_their_bytes(hub: Hub) -> None:
    v1 = {e.path: e for e in hub.manifest("v1")}
    assert reassemble(hub, v1["README.txt"]) == b"seismic volume f3\n"
    latest = {e.path: e for e in hub.manifest("latest")}
    assert reassemble(hub, latest["README.txt"]) == hub.files["README.txt"]


def test_read_blocks_reassembles_every_file(hub: Hub) -> None:
    for entry in hub.manifest():
        if entry.type == hub_pb2.ENTRY_TYPE_FILE:
            assert reassemble(hub, entry) == hub.files[entry.path], entry.path


def test_read_blocks_answers_each_request_in_order(hub: Hub) -> None:
    entry = {e.path: e for e in hub.manifest()}["volume/data.bin"]
    digests = [b.digest for b in entry.blocks]
    chunks = hub.read_blocks(digests[:2], [digests[5], digests[0]], [])
    assert [c.digest for c in chunks] == [digests[0], digests[1], digests[5], digests[0]]
    assert all(c.last and c.offset == 0 for c in chunks)


def test_big_blocks_come_in_chunks_of_at_most_1_mib_growing_from_64_kib(hub: Hub) -> None:
    request = hub_pb2.GetManifestRequest(dataset="big", ref="latest")
    (entry,) = list(hub.stub.GetManifest(request, timeout=RPC_TIMEOUT))
    first = entry.blocks[0]
    chunks = hub.read_blocks([first.digest])
    # a stream's first message is 64 KiB, each next twice the last (hub.serve.blockstream's
    # MessageRamp: a client that never reads stalls on 64 KiB), up to 1 MiB
    KiB = 1024
    assert [(c.offset, len(c.data), c.last) for c in chunks] == [
        (0, 64 * KiB, False),
        (64 * KiB, 128 * KiB, False),
        (192 * KiB, 256 * KiB, False),
        (448 * KiB, 512 * KiB, False),
        (960 * KiB, MiB, False),
        (1984 * KiB, MiB, False),
        (3008 * KiB, 64 * KiB, True),
    ]
    assert all(c.block_size == BIG_BLOCK for c in chunks)
    assert reassemble(hub, entry) == (hub.data.parent / "big" / "block.bin").read_bytes()


def test_small_blocks_come_packed_when_asked(hub: Hub, metrics: HubMetrics) -> None:
    entry = {e.path: e for e in hub.manifest()}["volume/data.bin"]
    digests = [b.digest for b in entry.blocks]  # five 1000-byte blocks and a 123-byte one
    served = metrics.registry.get_sample_value("strata_hub_blocks_served_total") or 0.0
    request = hub_pb2.ReadBlocksRequest(digests=[*digests, digests[0]], pack_bytes=2500)
    messages = list(hub.stub.ReadBlocks(iter([request]), timeout=RPC_TIMEOUT))
    runs = [[m.digest, *(more.digest for more in m.more)] for m in messages]
    # at most 2500 data bytes a message: 2 + 2 + (1000 + 123 + 1000)
    assert runs == [digests[0:2], digests[2:4], [*digests[4:6], digests[0]]]
    chunks = [c for m in messages for c in (m, *m.more)]
    assert all(c.offset == 0 and c.last for c in chunks)
    assert all(not more.more for m in messages for more in m.more)
    data = b"".join(c.data for c in chunks)
    assert data == hub.files["volume/data.bin"] + hub.files["volume/data.bin"][:BLOCK]
    after = metrics.registry.get_sample_value("strata_hub_blocks_served_total")
    assert after == served + 7


def test_packing_leaves_big_blocks_in_chunks_and_stops_at_an_unknown_block(hub: Hub) -> None:
    (big,) = list(hub.stub.GetManifest(hub_pb2.GetManifestRequest(dataset="big", ref="latest")))
    small = {e.path: e for e in hub.manifest()}["volume/data.bin"].blocks
    request = hub_pb2.ReadBlocksRequest(
        digests=[small[0].digest, big.blocks[0].digest, small[1].digest], pack_bytes=MiB
    )
    messages = list(hub.stub.ReadBlocks(iter([request]), timeout=RPC_TIMEOUT))
    KiB = 1024
    # the big block's chunks go on growing from where the first message left the ramp
    assert [(m.digest, m.offset, len(m.more)) for m in messages] == [
        (small[0].digest, 0, 0),
        *((big.blocks[0].digest, at * KiB, 0) for at in (0, 128, 384, 896, 1920, 2944)),
        (small[1].digest, 0, 0),
    ]
    unknown = "0" * 32
    request = hub_pb2.ReadBlocksRequest(
        digests=[small[0].digest, small[1].digest, unknown], pack_bytes=MiB
    )
    call = hub.stub.ReadBlocks(iter([request]), timeout=RPC_TIMEOUT)
    got = []
    with pytest.raises(grpc.RpcError) as info:
        for message in call:
            got += [message.digest, *(m.digest for m in message.more)]
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert got == [small[0].digest, small[1].digest]  # what came before it still arrives


def test_manifest_comes_in_pages_when_asked(hub: Hub) -> None:
    request = hub_pb2.GetManifestRequest(dataset="many", ref="v1", page_entries=100)
    messages = list(hub.stub.GetManifest(request, timeout=RPC_TIMEOUT))
    sizes = [1 + len(m.more) for m in messages]
    assert max(sizes) == 100
    assert len(messages) <= 10  # 700 entries; the hub pages its catalog reads too
    entries = [e for m in messages for e in (m, *m.more)]
    assert [e.path for e in entries] == [f"f{i:04d}" for i in range(MANY_FILES)]
    assert all(not e.more for m in messages for e in m.more)
    plain = hub_pb2.GetManifestRequest(dataset="many", ref="v1")
    assert len(list(hub.stub.GetManifest(plain, timeout=RPC_TIMEOUT))) == MANY_FILES


def test_pages_of_long_entries_end_by_their_bytes_and_lose_none(hub: Hub) -> None:
    """A ListDirectory page ends past LISTING_REPLY_BYTES and a GetManifest page past
    MANIFEST_MESSAGE_BYTES whatever ``page_size`` asks (entries of 1 KB paths here): what a
    reply its client does not read holds stays bounded (issue 39's fifth probe: a 4.1 MB
    listing held 12 MiB), and the pages still give every entry once, in order."""
    names = [f"f{i:04d}" for i in range(DEEP_FILES)]
    listed: list[str] = []
    pages, token = 0, ""
    while True:
        page = hub.stub.ListDirectory(
            hub_pb2.ListDirectoryRequest(
                dataset="deep", ref="v1", path=DEEP_DIR, page_size=2000, page_token=token
            ),
            timeout=RPC_TIMEOUT,
        )
        pages += 1
        assert page.ByteSize() < LISTING_REPLY_BYTES + 4096  # the cut, plus one entry
        listed += [e.path.rpartition("/")[2] for e in page.entries]
        token = page.next_page_token
        if not token:
            break
    assert listed == names and pages >= 3  # 600 entries of ~1 KB: three pages or more
    request = hub_pb2.GetManifestRequest(dataset="deep", ref="v1")
    paths = [e.path for e in hub.stub.GetManifest(request, timeout=RPC_TIMEOUT)]
    assert paths[-DEEP_FILES:] == [f"{DEEP_DIR}/{n}" for n in names]
    packed = hub_pb2.GetManifestRequest(dataset="deep", ref="v1", page_entries=512)
    messages = list(hub.stub.GetManifest(packed, timeout=RPC_TIMEOUT))
    assert [e.path for m in messages for e in (m, *m.more)] == paths
    assert max(m.ByteSize() for m in messages) < MANIFEST_MESSAGE_BYTES + 4096


def test_concurrent_streams(hub: Hub) -> None:
    files = [e for e in hub.manifest() if e.type == hub_pb2.ENTRY_TYPE_FILE]
    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(lambda e: reassemble(hub, e), files * 8))
    assert results == [hub.files[e.path] for e in files * 8]


@pytest.mark.parametrize(
    ("call", "code", "message"),
    [
        ("ListVersions", grpc.StatusCode.NOT_FOUND, "unknown dataset 'nope'"),
        ("ResolveRef", grpc.StatusCode.NOT_FOUND, "unknown dataset 'nope'"),
        ("GetManifest", grpc.StatusCode.NOT_FOUND, "unknown dataset 'nope'"),
    ],
)
def test_unknown_dataset_is_not_found(
    hub: Hub, call: str, code: grpc.StatusCode, message: str
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        if call == "ListVersions":
            hub.stub.ListVersions(hub_pb2.ListVersionsRequest(dataset="nope"), timeout=RPC_TIMEOUT)
        elif call == "ResolveRef":
            hub.stub.ResolveRef(
                hub_pb2.ResolveRefRequest(dataset="nope", ref="latest"), timeout=RPC_TIMEOUT
            )
        else:
            list(
                hub.stub.GetManifest(
                    hub_pb2.GetManifestRequest(dataset="nope", ref="v1"), timeout=RPC_TIMEOUT
                )
            )
    assert caught.value.code() == code
    assert message in caught.value.details()


@pytest.mark.parametrize(
    ("dataset", "ref", "code", "message"),
    [
        ("f3", "v9", grpc.StatusCode.NOT_FOUND, "no version v9"),
        ("f3", "nightly", grpc.StatusCode.NOT_FOUND, "no tag 'nightly'"),
        ("F3", "latest", grpc.StatusCode.INVALID_ARGUMENT, "invalid dataset name"),
        ("f3", "../etc", grpc.StatusCode.INVALID_ARGUMENT, "invalid reference"),
        ("f3", "", grpc.StatusCode.INVALID_ARGUMENT, "invalid reference"),
    ],
)
def test_resolve_ref_errors(
    hub: Hub, dataset: str, ref: str, code: grpc.StatusCode, message: str
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        hub.stub.ResolveRef(
            hub_pb2.ResolveRefRequest(dataset=dataset, ref=ref), timeout=RPC_TIMEOUT
        )
    assert caught.value.code() == code
    assert message in caught.value.details()


def test_malformed_digest_is_invalid_argument(hub: Hub) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        hub.read_blocks(["../../../etc/passwd"])
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed block digest" in caught.value.details()


def test_unknown_digest_is_not_found(hub: Hub) -> None:
    unknown = block_digest(b"not in the store")
    with pytest.raises(grpc.RpcError) as caught:
        hub.read_blocks([unknown])
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert unknown in caught.value.details()


def test_service_survives_errors(hub: Hub) -> None:
    with pytest.raises(grpc.RpcError):
        hub.read_blocks(["bad"])
    assert hub.stub.ListDatasets(hub_pb2.ListDatasetsRequest(), timeout=RPC_TIMEOUT).datasets


def test_requests_are_counted(hub: Hub, metrics: HubMetrics) -> None:
    def sample(method: str, code: str) -> float:
        value = metrics.registry.get_sample_value(
            "strata_hub_requests_total", {"method": method, "code": code}
        )
        return value or 0.0

    before_ok = sample("ResolveRef", "OK")
    before_nf = sample("ResolveRef", "NOT_FOUND")
    served_before = metrics.registry.get_sample_value("strata_hub_blocks_served_bytes_total") or 0.0
    hub.stub.ResolveRef(hub_pb2.ResolveRefRequest(dataset="f3", ref="v1"), timeout=RPC_TIMEOUT)
    with pytest.raises(grpc.RpcError):
        hub.stub.ResolveRef(hub_pb2.ResolveRefRequest(dataset="f3", ref="v7"), timeout=RPC_TIMEOUT)
    assert sample("ResolveRef", "OK") == before_ok + 1
    assert sample("ResolveRef", "NOT_FOUND") == before_nf + 1
    entry = {e.path: e for e in hub.manifest()}["volume/data.bin"]
    reassemble(hub, entry)
    served = metrics.registry.get_sample_value("strata_hub_blocks_served_bytes_total")
    assert served == served_before + entry.size


def test_publish_from_another_process_is_visible(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "one.txt").write_bytes(b"one")
    data = tmp_path / "data"
    publish(data, "live", src)
    with ServerThread(data) as server, grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = hub_pb2_grpc.HubStub(channel)
        request = hub_pb2.ResolveRefRequest(dataset="live", ref="latest")
        assert stub.ResolveRef(request, timeout=RPC_TIMEOUT).version == "v1"
        (src / "two.txt").write_bytes(b"two")
        done = subprocess.run(
            [sys.executable, "-m", "hub", "publish", "--data-dir", str(data), "live", str(src)],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout == "v2\n"
        resolved = stub.ResolveRef(request, timeout=RPC_TIMEOUT)
        assert resolved.version == "v2"
        assert resolved.file_count == 2
        entries = list(
            stub.GetManifest(
                hub_pb2.GetManifestRequest(dataset="live", ref="latest"), timeout=RPC_TIMEOUT
            )
        )
        assert [e.path for e in entries] == ["one.txt", "two.txt"]
        chunks = list(
            stub.ReadBlocks(
                iter([hub_pb2.ReadBlocksRequest(digests=[entries[1].blocks[0].digest])]),
                timeout=RPC_TIMEOUT,
            )
        )
        assert b"".join(c.data for c in chunks) == b"two"


def test_in_process_publish_while_serving(tmp_path: Path) -> None:
    """Publishing in the serving process shares its catalog environment (LMDB allows one)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"a")
    data = tmp_path / "data"
    data.mkdir()
    with ServerThread(data) as server, grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = hub_pb2_grpc.HubStub(channel)
        assert not stub.ListDatasets(hub_pb2.ListDatasetsRequest(), timeout=RPC_TIMEOUT).datasets
        publish(data, "fresh", src)
        listed = stub.ListDatasets(hub_pb2.ListDatasetsRequest(), timeout=RPC_TIMEOUT).datasets
        assert [(d.name, d.latest_version) for d in listed] == [("fresh", "v1")]
