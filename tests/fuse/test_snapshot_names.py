"""A lying hub answers a name with another, properly signed snapshot: ``ResolveRef(a, ...)``
with ``b``'s, ``ResolveRef(c, v1)`` with ``c``'s v2 (and GetManifest likewise, so the tree
it serves hashes right). The spoke refuses both, with and without ``--publisher-key``:
counted, logged, EIO in the mount, 502 from the admin API, the manifest never fetched."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from deploy.local import LocalStack, admin_headers
from hub.auth.signing import keygen
from hub.publish.tree import publish
from protocol.hub.v1 import hub_pb2, hub_pb2_grpc
from tests.integration.hub_support import write_tree
from tests.support import requires_fuse

pytestmark = [pytest.mark.fuse, requires_fuse, pytest.mark.timeout(180)]


class LyingHub(hub_pb2_grpc.HubServicer):
    """Forwards every call to the hub, but answers ``ResolveRef`` and ``GetManifest`` for
    the names in ``lies`` (``(dataset, ref or None for any) -> (dataset, ref)``) with the
    other name's; records the manifests the spoke asks for."""

    def __init__(
        self, upstream: hub_pb2_grpc.HubStub, lies: dict[tuple[str, str | None], tuple[str, str]]
    ) -> None:
        self.up, self.lies = upstream, lies
        self.manifests_asked: list[tuple[str, str]] = []

    def _swap(self, dataset: str, ref: str) -> tuple[str, str]:
        if (dataset, ref) in self.lies:
            return self.lies[(dataset, ref)]
        if (dataset, None) in self.lies:
            return self.lies[(dataset, None)][0], ref
        return dataset, ref

    def ListDatasets(self, request: Any, context: Any) -> Any:
        return self.up.ListDatasets(request)

    def ListVersions(self, request: Any, context: Any) -> Any:
        return self.up.ListVersions(request)

    def ResolveRef(self, request: Any, context: Any) -> Any:
        dataset, ref = self._swap(request.dataset, request.ref)
        return self.up.ResolveRef(hub_pb2.ResolveRefRequest(dataset=dataset, ref=ref))

    def ListDirectory(self, request: Any, context: Any) -> Any:
        return self.up.ListDirectory(request)

    def GetManifest(self, request: Any, context: Any) -> Iterator[hub_pb2.ManifestEntry]:
        self.manifests_asked.append((request.dataset, request.ref))
        forwarded = hub_pb2.GetManifestRequest()
        forwarded.CopyFrom(request)
        forwarded.dataset, forwarded.ref = self._swap(request.dataset, request.ref)
        yield from self.up.GetManifest(forwarded)

    def ReadBlocks(self, request_iterator: Any, context: Any) -> Any:
        yield from self.up.ReadBlocks(request_iterator)

    def Watch(self, request: Any, context: Any) -> Any:
        yield from self.up.Watch(request)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """Datasets good, a, b (v1 each) and c (v1, v2), all signed by one publisher key."""
    keygen(tmp_path / "publisher.key", tmp_path / "publisher.pem")
    key = tmp_path / "publisher.key"
    data = tmp_path / "data"
    for dataset, content in (("good", b"good"), ("a", b"tenant a"), ("b", b"tenant b")):
        src = write_tree(tmp_path / f"src-{dataset}", {"f.bin": content})
        publish(data, dataset, src, signing_key=key)
    for version in ("v1", "v2"):
        src = write_tree(tmp_path / f"src-c-{version}", {"f.bin": f"c {version}".encode()})
        publish(data, "c", src, signing_key=key)
    return data


def _metric(text: str, name: str) -> float:
    return next(float(line.split()[1]) for line in text.splitlines() if line.startswith(name + " "))


@pytest.mark.parametrize("publisher_key", [True, False], ids=["publisher-key", "no-key"])
def test_a_signed_snapshot_of_another_name_is_refused(
    tmp_path: Path, data: Path, publisher_key: bool, capfd: pytest.CaptureFixture[str]
) -> None:
    lies: dict[tuple[str, str | None], tuple[str, str]] = {
        ("a", None): ("b", ""),  # every ref of a answered with b's
        ("c", "v1"): ("c", "v2"),
    }
    cache, mnt = tmp_path / "cache", tmp_path / "mnt"
    flags = ("--miss-deadline", "5")
    if publisher_key:
        flags += ("--publisher-key", str(tmp_path / "publisher.pem"))
    with LocalStack() as stack:
        hub = stack.start_hub(data)
        with grpc.insecure_channel(hub) as channel:
            liar = LyingHub(hub_pb2_grpc.HubStub(channel), lies)
            server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
            hub_pb2_grpc.add_HubServicer_to_server(liar, server)  # type: ignore[no-untyped-call]
            port = server.add_insecure_port("127.0.0.1:0")
            server.start()
            try:
                admin = stack.start_spoke(f"127.0.0.1:{port}", cache, mnt, "16MiB", extra=flags)
                assert (mnt / "good" / "v1" / "f.bin").read_bytes() == b"good"
                assert (mnt / "c" / "v2" / "f.bin").read_bytes() == b"c v2"
                for path in ("a/v1", "a/latest", "c/v1"):
                    with pytest.raises(OSError) as caught:
                        (mnt / path / "f.bin").read_bytes()
                    assert caught.value.errno == errno.EIO, path
                auth = admin_headers(cache)
                for body, said in (
                    ({"dataset": "a", "ref": "latest"}, "it is a snapshot of dataset 'b'"),
                    ({"dataset": "c", "ref": "v1"}, "it is version 'v2'"),
                ):
                    reply = httpx.post(f"{admin}/v1/prewarm", json=body, headers=auth, timeout=10)
                    assert reply.status_code == 502, reply.text
                    assert said in reply.json()["detail"]
                metrics = httpx.get(f"{admin}/metrics", headers=auth, timeout=10).text
                assert _metric(metrics, "strata_spoke_snapshot_mismatches_total") >= 5
                # the lies were properly signed: the name check refused them, not the key
                assert _metric(metrics, "strata_spoke_signature_refusals_total") == 0
                stats = httpx.get(f"{admin}/v1/cache", headers=auth, timeout=10).json()
                assert set(stats["datasets"]) == {"good", "c"}
            finally:
                server.stop(0)
    asked = set(liar.manifests_asked)
    assert asked == {("good", "v1"), ("c", "v2")}, asked  # never a's, never c's v1
    err = capfd.readouterr().err
    assert "given for a@latest refused: it is a snapshot of dataset 'b'" in err
    assert "given for c@v1 refused: it is version 'v2'" in err
