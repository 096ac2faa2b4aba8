"""Operations: directory listing, health, reflection, graceful stop, metrics, revocation."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from hub.catalog import Catalog
from hub.publish.tree import publish
from hub.serve.metrics import HubMetrics
from hub.serve.serverthread import ServerThread
from hub.snapshot.blocks import MiB
from hub.store.blobstore import LocalBlobStore
from hub.store.gc import collect
from protocol.hub.v1 import hub_pb2, hub_pb2_grpc
from tests.integration.hub_support import RPC_TIMEOUT, manifest, read_all, write_tree

FILES = {f"dir/f{i:03d}": str(i).encode() for i in range(25)}
FILES |= {"dir/sub/deep.txt": b"deep", "dir-b/x": b"x", "top.txt": b"top", "dir.txt": b"t"}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, hub_pb2_grpc.HubStub, HubMetrics, int]]:
    data = tmp_path / "data"
    publish(data, "f3", write_tree(tmp_path / "src", FILES))
    metrics = HubMetrics()
    with (
        ServerThread(data, metrics=metrics) as server,
        grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel,
    ):
        yield data, hub_pb2_grpc.HubStub(channel), metrics, server.port


def listing(
    stub: hub_pb2_grpc.HubStub, path: str, page_size: int, ref: str = "latest"
) -> tuple[list[str], int]:
    """Every child path of a directory, paging; returns the paths and the page count."""
    paths: list[str] = []
    token, pages = "", 0
    while True:
        page = stub.ListDirectory(
            hub_pb2.ListDirectoryRequest(
                dataset="f3", ref=ref, path=path, page_size=page_size, page_token=token
            ),
            timeout=RPC_TIMEOUT,
        )
        pages += 1
        paths += [entry.path for entry in page.entries]
        token = page.next_page_token
        if not token:
            return paths, pages


def test_list_directory_pages_in_name_order(
    served: tuple[Path, hub_pb2_grpc.HubStub, HubMetrics, int],
) -> None:
    _, stub, _, _ = served
    root, pages = listing(stub, "", 1000)
    assert (root, pages) == (["dir", "dir-b", "dir.txt", "top.txt"], 1)
    children, pages = listing(stub, "dir", 7)
    assert children == [f"dir/f{i:03d}" for i in range(25)] + ["dir/sub"]
    assert pages == 4
    assert listing(stub, "dir/sub", 0) == (["dir/sub/deep.txt"], 1)
    whole = manifest(stub, "f3")
    page = stub.ListDirectory(hub_pb2.ListDirectoryRequest(dataset="f3", ref="v1", path="dir"))
    assert list(page.entries[:3]) == [whole["dir/f000"], whole["dir/f001"], whole["dir/f002"]]
    assert page.snapshot.version == "v1"


def test_page_tokens_stay_on_their_version(
    served: tuple[Path, hub_pb2_grpc.HubStub, HubMetrics, int], tmp_path: Path
) -> None:
    data, stub, _, _ = served
    first = stub.ListDirectory(
        hub_pb2.ListDirectoryRequest(dataset="f3", ref="latest", path="dir", page_size=10)
    )
    publish(data, "f3", write_tree(tmp_path / "v2", {"dir/only": b"v2"}))
    second = stub.ListDirectory(
        hub_pb2.ListDirectoryRequest(
            dataset="f3", ref="latest", path="dir", page_size=10, page_token=first.next_page_token
        )
    )
    assert second.snapshot.version == "v1"
    assert second.entries[0].path == "dir/f010"
    with Catalog(data / "catalog") as catalog:
        catalog.revoke("f3", "v1")
    with pytest.raises(grpc.RpcError) as caught:
        stub.ListDirectory(
            hub_pb2.ListDirectoryRequest(
                dataset="f3", ref="latest", path="dir", page_token=second.next_page_token
            )
        )
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert "f3 v1 was revoked" in caught.value.details()


def test_revoked_versions_are_not_resolvable_or_readable(
    served: tuple[Path, hub_pb2_grpc.HubStub, HubMetrics, int], tmp_path: Path
) -> None:
    data, stub, _, _ = served
    old = manifest(stub, "f3")
    only_v1 = old["top.txt"].blocks[0].digest
    shared = old["dir.txt"].blocks[0].digest
    changed = dict(FILES, **{"top.txt": b"new top"})
    publish(data, "f3", write_tree(tmp_path / "v2", changed))
    with Catalog(data / "catalog") as catalog:
        revocation = catalog.revoke("f3", "v1")
    assert revocation.removed_tags == ()
    for call in (
        lambda: stub.ResolveRef(hub_pb2.ResolveRefRequest(dataset="f3", ref="v1")),
        lambda: list(stub.GetManifest(hub_pb2.GetManifestRequest(dataset="f3", ref="v1"))),
        lambda: read_all(stub, [only_v1]),
    ):
        with pytest.raises(grpc.RpcError) as caught:
            call()
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert read_all(stub, [shared]) == {shared: b"t"}, "v2 still holds it"
    versions = stub.ListVersions(hub_pb2.ListVersionsRequest(dataset="f3"))
    assert [v.version for v in versions.versions] == ["v2"]
    with Catalog(data / "catalog") as catalog:
        result = collect(catalog, LocalBlobStore(data / "blobs"))
    assert result.blobs_deleted == 1
    assert not LocalBlobStore(data / "blobs").exists(only_v1)


def test_health_and_reflection(served: tuple[Path, hub_pb2_grpc.HubStub, HubMetrics, int]) -> None:
    _, _, _, port = served
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "protocol.hub.v1.Hub"):
            response = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert response.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as caught:
            health.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=5)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        (response,) = list(reflection.ServerReflectionInfo(iter([request]), timeout=5))
        names = {service.name for service in response.list_services_response.service}
        assert {"protocol.hub.v1.Hub", "grpc.health.v1.Health"} <= names
        request = reflection_pb2.ServerReflectionRequest(
            file_containing_symbol="protocol.hub.v1.Hub"
        )
        (response,) = list(reflection.ServerReflectionInfo(iter([request]), timeout=5))
        assert response.file_descriptor_response.file_descriptor_proto


def test_graceful_stop_lets_streams_finish(tmp_path: Path) -> None:
    data = tmp_path / "data"
    blocks = 8
    src = write_tree(tmp_path / "src", {f"b{i}": os.urandom(MiB) for i in range(blocks)})
    publish(data, "f3", src, block_size=MiB)
    server = ServerThread(data, grace=10.0).start()
    port = server.port
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = hub_pb2_grpc.HubStub(channel)
        digests = [e.blocks[0].digest for e in manifest(stub, "f3").values()]
        health = health_pb2_grpc.HealthStub(channel)
        stream = stub.ReadBlocks(iter([hub_pb2.ReadBlocksRequest(digests=digests * 4)]), timeout=60)
        received = [next(stream)]
        stopper = threading.Thread(target=server.stop)
        stopper.start()
        deadline = time.monotonic() + 10
        status = health_pb2.HealthCheckResponse.SERVING
        while time.monotonic() < deadline and status == health_pb2.HealthCheckResponse.SERVING:
            try:
                status = health.Check(health_pb2.HealthCheckRequest(), timeout=1).status
            except grpc.RpcError:
                break  # already refusing new calls
            time.sleep(0.05)
        for chunk in stream:  # a slow reader still gets everything
            received.append(chunk)
        stopper.join(timeout=20)
        assert not stopper.is_alive()
    assert sum(len(c.data) for c in received) == 4 * blocks * MiB
    assert sum(c.last for c in received) == 4 * blocks
    with (
        grpc.insecure_channel(f"127.0.0.1:{port}") as channel,
        pytest.raises(grpc.RpcError) as caught,
    ):
        hub_pb2_grpc.HubStub(channel).ListDatasets(hub_pb2.ListDatasetsRequest(), timeout=2)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def test_metrics(served: tuple[Path, hub_pb2_grpc.HubStub, HubMetrics, int]) -> None:
    _, stub, metrics, _ = served
    registry = metrics.registry
    entry = manifest(stub, "f3")["top.txt"]
    read_all(stub, [entry.blocks[0].digest])
    assert (
        registry.get_sample_value(
            "strata_hub_requests_total", {"method": "GetManifest", "code": "OK"}
        )
        == 1
    )
    assert registry.get_sample_value("strata_hub_blocks_served_bytes_total") == 3
    assert registry.get_sample_value("strata_hub_blocks_served_total") == 1
    assert registry.get_sample_value("strata_hub_active_streams", {"method": "ReadBlocks"}) == 0
    assert registry.get_sample_value("strata_hub_handshakes_waiting", {"port": "grpc"}) == 0
    rate = registry.get_sample_value("strata_hub_handshake_rate", {"port": "grpc"})
    assert rate is not None and 100 <= rate <= 4000
    assert registry.get_sample_value("strata_hub_catalog_datasets") == 1
    assert registry.get_sample_value("strata_hub_catalog_versions", {"state": "live"}) == 1
    assert registry.get_sample_value("strata_hub_catalog_blocks") == len(set(FILES.values()))
    assert registry.get_sample_value("strata_hub_catalog_block_bytes") == sum(
        len(v) for v in set(FILES.values())
    )
    assert registry.get_sample_value("strata_hub_catalog_last_sequence") == 2
    call = stub.Watch(hub_pb2.WatchRequest(), timeout=30)
    next(call)
    assert registry.get_sample_value("strata_hub_active_streams", {"method": "Watch"}) == 1
    call.cancel()
