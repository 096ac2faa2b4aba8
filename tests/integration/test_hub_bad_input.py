"""Bad input: each case gets the right status with a message, is counted, and the hub
keeps serving everyone else (token and certificate cases: test_hub_security.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from hub.publish.tree import publish
from hub.serve.metrics import HubMetrics
from hub.serve.serverthread import ServerThread
from hub.serve.service import MAX_DIGESTS_PER_REQUEST
from hub.serve.wire import CORE_REQUEST_BYTES, MAX_REQUEST_BYTES
from hub.snapshot.blocks import MiB, block_digest
from protocol.hub.v1 import hub_pb2, hub_pb2_grpc
from tests.integration.hub_support import RPC_TIMEOUT, read_all, sample, serves, write_tree


@pytest.fixture(scope="module")
def metrics() -> HubMetrics:
    return HubMetrics()


@pytest.fixture(scope="module")
def stub(
    tmp_path_factory: pytest.TempPathFactory, metrics: HubMetrics
) -> Iterator[hub_pb2_grpc.HubStub]:
    base = tmp_path_factory.mktemp("bad")
    publish(base / "data", "f3", write_tree(base / "src", {"a/b.bin": b"bytes", "c.txt": b"c"}))
    with (
        ServerThread(base / "data", metrics=metrics) as server,
        grpc.insecure_channel(
            f"127.0.0.1:{server.port}", options=[("grpc.max_receive_message_length", -1)]
        ) as channel,
    ):
        yield hub_pb2_grpc.HubStub(channel)


def resolve(dataset: str, ref: str = "latest") -> Callable[[hub_pb2_grpc.HubStub], Any]:
    request = hub_pb2.ResolveRefRequest(dataset=dataset, ref=ref)
    return lambda stub: stub.ResolveRef(request, timeout=RPC_TIMEOUT)


def list_dir(path: str, token: str = "") -> Callable[[hub_pb2_grpc.HubStub], Any]:
    request = hub_pb2.ListDirectoryRequest(dataset="f3", ref="latest", path=path, page_token=token)
    return lambda stub: stub.ListDirectory(request, timeout=RPC_TIMEOUT)


def read(*requests: list[str]) -> Callable[[hub_pb2_grpc.HubStub], Any]:
    messages = [hub_pb2.ReadBlocksRequest(digests=digests) for digests in requests]
    return lambda stub: list(stub.ReadBlocks(iter(messages), timeout=60))


def watch(after: int) -> Callable[[hub_pb2_grpc.HubStub], Any]:
    return lambda stub: list(stub.Watch(hub_pb2.WatchRequest(after_sequence=after), timeout=5))


INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED

CASES = [
    ("dotdot-dataset", "ResolveRef", resolve(".."), INVALID, "invalid dataset name '..'"),
    ("slash-dataset", "ResolveRef", resolve("f3/../x"), INVALID, "invalid dataset name"),
    ("nul-dataset", "ResolveRef", resolve("f3\0"), INVALID, "invalid dataset name"),
    ("long-dataset", "ResolveRef", resolve("f" * 65), INVALID, "invalid dataset name"),
    ("dotdot-ref", "ResolveRef", resolve("f3", ".."), INVALID, "invalid reference"),
    ("slash-ref", "ResolveRef", resolve("f3", "a/b"), INVALID, "invalid reference"),
    ("nul-ref", "ResolveRef", resolve("f3", "latest\0"), INVALID, "invalid reference"),
    ("long-ref", "ResolveRef", resolve("f3", "t" * 65), INVALID, "invalid reference"),
    ("unknown-version", "ResolveRef", resolve("f3", "v9"), NOT_FOUND, "no version v9"),
    ("unknown-tag", "ResolveRef", resolve("f3", "nightly"), NOT_FOUND, "no tag 'nightly'"),
    ("unknown-dataset", "ResolveRef", resolve("nope"), NOT_FOUND, "unknown dataset 'nope'"),
    ("dotdot-path", "ListDirectory", list_dir("a/../.."), INVALID, "'..' component"),
    ("absolute-path", "ListDirectory", list_dir("/etc"), INVALID, "invalid manifest path"),
    ("nul-path", "ListDirectory", list_dir("a\0b"), INVALID, "invalid manifest path"),
    ("long-path", "ListDirectory", list_dir("d/" * 2100 + "x"), INVALID, "over 4095"),
    ("long-name", "ListDirectory", list_dir("n" * 256), INVALID, "over 255 bytes"),
    ("missing-path", "ListDirectory", list_dir("zzz"), NOT_FOUND, "no entry 'zzz'"),
    ("file-as-dir", "ListDirectory", list_dir("c.txt"), INVALID, "'c.txt' is not a directory"),
    ("bad-page-token", "ListDirectory", list_dir("", "%%%"), INVALID, "malformed page token"),
    ("short-digest", "ReadBlocks", read(["abc"]), INVALID, "malformed block digest 'abc'"),
    ("upper-digest", "ReadBlocks", read(["A" * 32]), INVALID, "malformed block digest"),
    ("path-digest", "ReadBlocks", read(["../" * 10 + "ab"]), INVALID, "malformed block digest"),
    ("long-digest", "ReadBlocks", read(["0" * 33]), INVALID, "malformed block digest"),
    (
        "unknown-digest",
        "ReadBlocks",
        read([block_digest(b"never published")]),
        NOT_FOUND,
        f"unknown block {block_digest(b'never published')}",
    ),
    (
        "too-many-digests",
        "ReadBlocks",
        read(["0" * 32] * (MAX_DIGESTS_PER_REQUEST + 1)),
        EXHAUSTED,
        f"at most {MAX_DIGESTS_PER_REQUEST} are allowed",
    ),
    (
        "oversize-digests",  # 1,500 digests: 51 KB, over the hub's request limit
        "ReadBlocks",
        read(["0" * 32] * 1_500),
        EXHAUSTED,
        f"over the {MAX_REQUEST_BYTES}-byte limit",
    ),
    (
        "oversize-message",
        "ResolveRef",
        resolve("x" * (MAX_REQUEST_BYTES + 1)),
        EXHAUSTED,
        f"over the {MAX_REQUEST_BYTES}-byte limit",
    ),
    ("future-sequence", "Watch", watch(10**9), grpc.StatusCode.OUT_OF_RANGE, "ahead of"),
]


@pytest.mark.parametrize(
    ("method", "call", "code", "message"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_bad_input(
    stub: hub_pb2_grpc.HubStub,
    metrics: HubMetrics,
    method: str,
    call: Callable[[hub_pb2_grpc.HubStub], Any],
    code: grpc.StatusCode,
    message: str,
) -> None:
    before = sample(metrics, method, code.name)
    with pytest.raises(grpc.RpcError) as caught:
        call(stub)
    assert caught.value.code() == code, caught.value.details()
    assert message in caught.value.details()
    assert sample(metrics, method, code.name) == before + 1
    assert serves(stub)


@pytest.mark.parametrize(
    "call",
    [read(["0" * 32] * 1_000_000), resolve("x" * (4 * MiB))],
    ids=["million-digests", "4-MiB-name"],
)
def test_requests_over_the_core_limit_are_refused_before_they_are_received(
    stub: hub_pb2_grpc.HubStub, call: Callable[[hub_pb2_grpc.HubStub], Any]
) -> None:
    """gRPC core refuses a message declaring more than its 64 KiB limit as its length
    arrives (hub.serve.wire.CORE_REQUEST_BYTES), so none of it is buffered; its message says so."""
    with pytest.raises(grpc.RpcError) as caught:
        call(stub)
    assert caught.value.code() == EXHAUSTED
    assert "larger than max" in caught.value.details()
    assert f"vs. {CORE_REQUEST_BYTES}" in caught.value.details()
    assert serves(stub)


def test_a_bad_request_in_a_stream_ends_only_that_stream(stub: hub_pb2_grpc.HubStub) -> None:
    request = hub_pb2.GetManifestRequest(dataset="f3", ref="latest")
    good = next(e for e in stub.GetManifest(request, timeout=RPC_TIMEOUT) if e.path == "c.txt")
    digest = good.blocks[0].digest
    with pytest.raises(grpc.RpcError) as caught:
        read([digest], ["nonsense"])(stub)
    assert caught.value.code() == INVALID
    assert read_all(stub, [digest]) == {digest: b"c"}


def test_message_size_limit_is_configurable(tmp_path: Path) -> None:
    from hub.serve.config import ServerConfig

    data = tmp_path / "data"
    publish(data, "f3", write_tree(tmp_path / "src", {"big": bytes(3 * MiB)}), block_size=4 * MiB)
    config = ServerConfig(max_message_bytes=256 * 1024)
    metrics = HubMetrics()
    with (
        ServerThread(data, metrics=metrics, config=config) as server,
        grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel,
    ):
        hub = hub_pb2_grpc.HubStub(channel)
        with pytest.raises(grpc.RpcError) as caught:  # requests keep their own limit
            resolve("x" * (MAX_REQUEST_BYTES + 1))(hub)
        assert caught.value.code() == EXHAUSTED
        assert f"over the {MAX_REQUEST_BYTES}-byte limit" in caught.value.details()
        entry = next(iter(hub.GetManifest(hub_pb2.GetManifestRequest(dataset="f3", ref="v1"))))
        chunks = list(
            hub.ReadBlocks(iter([hub_pb2.ReadBlocksRequest(digests=[entry.blocks[0].digest])]))
        )
        assert max(len(c.data) for c in chunks) <= 128 * 1024, "chunks fit the smaller limit"
        assert sum(len(c.data) for c in chunks) == 3 * MiB
    from hub.errors import ConfigError

    with pytest.raises(ConfigError, match="below"):
        ServerThread(data, config=ServerConfig(max_message_bytes=1000)).start()
