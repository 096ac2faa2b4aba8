"""Someone on the path rewrites one manifest entry: the spoke recomputes the snapshot id,
refuses the manifest (counted, logged, EIO in the mount, 502 from the admin API) and
stores nothing; the untouched snapshot next to it reads fine. One who also rewrites the
snapshot id (no publisher key to stop it) still cannot make the mount show a path the hub
never publishes (``..``): the tree check refuses it the same way."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from deploy.local import LocalStack
from hub.publish.tree import publish
from hub.serve.serverthread import ServerThread
from protocol.hub.v1 import hub_pb2, hub_pb2_grpc
from spoke.catalog.manifestcheck import snapshot_id
from tests.integration.hub_support import write_tree
from tests.support import requires_fuse

pytestmark = [pytest.mark.fuse, requires_fuse, pytest.mark.timeout(180)]


class TamperingProxy(hub_pb2_grpc.HubServicer):
    """Forwards every call to the hub; changes the size of ``victim`` in ``dataset``'s
    manifests (and nothing else)."""

    def __init__(self, upstream: hub_pb2_grpc.HubStub, dataset: str, victim: str) -> None:
        self.up, self.dataset, self.victim = upstream, dataset, victim

    def ListDatasets(self, request: Any, context: Any) -> Any:
        return self.up.ListDatasets(request)

    def ListVersions(self, request: Any, context: Any) -> Any:
        return self.up.ListVersions(request)

    def ResolveRef(self, request: Any, context: Any) -> Any:
        return self.up.ResolveRef(request)

    def ListDirectory(self, request: Any, context: Any) -> Any:
        return self.up.ListDirectory(request)

    def GetManifest(self, request: Any, context: Any) -> Iterator[hub_pb2.ManifestEntry]:
        for message in self.up.GetManifest(request):
            for entry in (message, *message.more):  # a page when the spoke asked for pages
                if request.dataset == self.dataset and entry.path == self.victim:
                    entry.mtime_ns += 1  # one field of one entry
            yield message

    def ReadBlocks(self, request_iterator: Any, context: Any) -> Any:
        yield from self.up.ReadBlocks(request_iterator)

    def Watch(self, request: Any, context: Any) -> Any:
        yield from self.up.Watch(request)


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[str]:
    data = tmp_path / "data"
    publish(data, "good", write_tree(tmp_path / "g", {"a.bin": b"good bytes"}))
    publish(data, "bad", write_tree(tmp_path / "b", {"a.bin": b"bad bytes", "z.bin": b"z"}))
    with ServerThread(data) as hub, grpc.insecure_channel(f"127.0.0.1:{hub.port}") as channel:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        servicer = TamperingProxy(hub_pb2_grpc.HubStub(channel), "bad", "z.bin")
        hub_pb2_grpc.add_HubServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        try:
            yield f"127.0.0.1:{port}"
        finally:
            server.stop(0)


def test_a_rewritten_manifest_entry_is_refused(
    tmp_path: Path, proxy: str, capfd: pytest.CaptureFixture[str]
) -> None:
    with LocalStack() as stack:
        admin = stack.start_spoke(
            proxy,
            tmp_path / "cache",
            tmp_path / "mnt",
            "16MiB",
            extra=("--miss-deadline", "5"),
            admin_token=True,
        )
        mnt = tmp_path / "mnt"
        assert (mnt / "good" / "v1" / "a.bin").read_bytes() == b"good bytes"
        with pytest.raises(OSError) as caught:
            os.listdir(mnt / "bad" / "v1")
        assert caught.value.errno == errno.EIO
        auth = {
            "Authorization": f"Bearer {(tmp_path / 'cache' / 'admin.token').read_text().strip()}"
        }
        assert httpx.post(f"{admin}/v1/prewarm", json={"dataset": "bad"}).status_code == 401
        reply = httpx.post(f"{admin}/v1/prewarm", json={"dataset": "bad"}, headers=auth, timeout=10)
        assert reply.status_code == 502
        assert "manifest of bad v1 refused" in reply.json()["detail"]
        text = httpx.get(f"{admin}/metrics", headers=auth, timeout=10).text
        count = next(
            float(line.split()[1])
            for line in text.splitlines()
            if line.startswith("strata_spoke_manifest_mismatches_total ")
        )
        assert count >= 2  # the mount's lookup and the prewarm; nothing was stored
        stats = httpx.get(f"{admin}/v1/cache", headers=auth, timeout=10).json()
        assert "bad" not in stats["datasets"]
    assert "manifest of bad v1 refused: it hashes to" in capfd.readouterr().err


class PathRewritingProxy(TamperingProxy):
    """A proxy not trusted for content that is smarter: it renames ``victim`` in
    ``dataset``'s manifests to ``renamed`` and answers ResolveRef and ListVersions with
    the id the rewritten manifest hashes to, so the hash check passes."""

    def __init__(
        self, upstream: hub_pb2_grpc.HubStub, dataset: str, victim: str, renamed: str
    ) -> None:
        super().__init__(upstream, dataset, victim)
        self.renamed = renamed

    def _rewritten(self, version: str) -> list[hub_pb2.ManifestEntry]:
        request = hub_pb2.GetManifestRequest(dataset=self.dataset, ref=version)
        entries = list(self.up.GetManifest(request))
        for entry in entries:
            if entry.path == self.victim:
                entry.path = self.renamed
        return entries

    def _retarget(self, snapshot: hub_pb2.Snapshot) -> None:
        if snapshot.dataset == self.dataset:
            entries = self._rewritten(snapshot.version)
            snapshot.snapshot_id = snapshot_id(snapshot.block_size, entries)

    def ListVersions(self, request: Any, context: Any) -> Any:
        reply = self.up.ListVersions(request)
        for snapshot in reply.versions:
            self._retarget(snapshot)
        return reply

    def ResolveRef(self, request: Any, context: Any) -> Any:
        snapshot = self.up.ResolveRef(request)
        self._retarget(snapshot)
        return snapshot

    def GetManifest(self, request: Any, context: Any) -> Iterator[hub_pb2.ManifestEntry]:
        for message in self.up.GetManifest(request):
            for entry in (message, *message.more):
                if request.dataset == self.dataset and entry.path == self.victim:
                    entry.path = self.renamed
            yield message


@pytest.fixture
def renaming_proxy(tmp_path: Path) -> Iterator[str]:
    data = tmp_path / "data"
    publish(data, "good", write_tree(tmp_path / "g", {"a.bin": b"good bytes"}))
    publish(data, "bad", write_tree(tmp_path / "b", {"a.bin": b"bad bytes", "z.bin": b"z"}))
    with ServerThread(data) as hub, grpc.insecure_channel(f"127.0.0.1:{hub.port}") as channel:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        servicer = PathRewritingProxy(hub_pb2_grpc.HubStub(channel), "bad", "z.bin", "z/../z.bin")
        hub_pb2_grpc.add_HubServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        try:
            yield f"127.0.0.1:{port}"
        finally:
            server.stop(0)


def test_a_manifest_with_a_dotdot_path_and_a_recomputed_id_is_refused(
    tmp_path: Path, renaming_proxy: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """No ``--publisher-key``: nothing vouches for the content but the paths themselves.
    ``z/../z.bin`` is no path the hub publishes: refused (counted, logged, EIO in the mount,
    502 from the admin API), nothing stored; the other dataset reads fine."""
    with LocalStack() as stack:
        admin = stack.start_spoke(
            renaming_proxy,
            tmp_path / "cache",
            tmp_path / "mnt",
            "16MiB",
            extra=("--miss-deadline", "5"),
            admin_token=True,
        )
        mnt = tmp_path / "mnt"
        assert (mnt / "good" / "v1" / "a.bin").read_bytes() == b"good bytes"
        with pytest.raises(OSError) as caught:
            os.listdir(mnt / "bad" / "v1")
        assert caught.value.errno == errno.EIO
        token = (tmp_path / "cache" / "admin.token").read_text().strip()
        auth = {"Authorization": f"Bearer {token}"}
        reply = httpx.post(f"{admin}/v1/prewarm", json={"dataset": "bad"}, headers=auth, timeout=10)
        assert reply.status_code == 502
        assert reply.json()["detail"] == (
            "manifest of bad v1 refused: invalid path 'z/../z.bin': an empty, '.' or '..' component"
        )
        text = httpx.get(f"{admin}/metrics", headers=auth, timeout=10).text
        counts = {
            line.split()[0]: float(line.split()[1])
            for line in text.splitlines()
            if line.startswith(("strata_spoke_invalid_manifests_total ", "strata_spoke_manifest_m"))
        }
        assert counts["strata_spoke_invalid_manifests_total"] >= 2  # the mount's and the prewarm's
        assert counts["strata_spoke_manifest_mismatches_total"] == 0  # it hashed right
        stats = httpx.get(f"{admin}/v1/cache", headers=auth, timeout=10).json()
        assert "bad" not in stats["datasets"]
    assert "manifest of bad v1 refused: invalid path 'z/../z.bin'" in capfd.readouterr().err
