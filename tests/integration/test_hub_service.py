"""The hub's gRPC service on loopback, a real grpc.aio server and a blocking client: its
catalog calls (datasets, versions, refs, manifests whole and in pages, directory listings
bounded by their bytes), their errors, and what is published while it serves. ReadBlocks
is in ``test_hub_service_blocks.py``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from hub.publish.tree import publish
from hub.serve.serverthread import ServerThread
from hub.serve.service import LISTING_REPLY_BYTES
from hub.serve.wire import MANIFEST_MESSAGE_BYTES
from protocol.hub.v1 import hub_pb2, hub_pb2_grpc
from tests.integration.hub_service_support import (
    BLOCK,
    DEEP_DIR,
    DEEP_FILES,
    MANY_FILES,
    RPC_TIMEOUT,
    Hub,
    hub_fixture,  # noqa: F401  (the hub fixture)
    metrics_fixture,  # noqa: F401  (the metrics fixture)
    reassemble,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


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
