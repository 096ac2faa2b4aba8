"""Watch: catalog events with gap-free sequence numbers, resumable, across processes."""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from hub.catalog import Catalog
from hub.publish.tree import publish
from hub.serve.metrics import HubMetrics
from hub.serve.serverthread import ServerThread
from protocol.hub.v1 import hub_pb2, hub_pb2_grpc
from tests.integration.hub_support import RPC_TIMEOUT, write_tree

REPO_ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = hub_pb2.EVENT_KIND_VERSION_PUBLISHED
MOVED = hub_pb2.EVENT_KIND_TAG_MOVED
REMOVED = hub_pb2.EVENT_KIND_TAG_REMOVED
REVOKED = hub_pb2.EVENT_KIND_VERSION_REVOKED


class Hub:
    def __init__(self, data: Path, src: Path, port: int, metrics: HubMetrics) -> None:
        self.data, self.src, self.metrics = data, src, metrics
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = hub_pb2_grpc.HubStub(self.channel)


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[Hub]:
    src = write_tree(tmp_path / "src", {"a.txt": b"one"})
    data = tmp_path / "data"
    publish(data, "f3", src)
    metrics = HubMetrics()
    with ServerThread(data, metrics=metrics) as server:
        client = Hub(data, src, server.port, metrics)
        yield client
        client.channel.close()


class Collector:
    """Reads a Watch stream on a thread; events (with arrival time) go to a queue."""

    def __init__(self, stub: hub_pb2_grpc.HubStub, request: hub_pb2.WatchRequest) -> None:
        self.events: queue.Queue[tuple[hub_pb2.CatalogEvent, int]] = queue.Queue()
        self.call = stub.Watch(request, timeout=60)
        self.error: grpc.RpcError | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for event in self.call:
                self.events.put((event, time.time_ns()))
        except grpc.RpcError as exc:
            self.error = exc

    def take(self, count: int, timeout: float = 10.0) -> list[hub_pb2.CatalogEvent]:
        return [self.events.get(timeout=timeout)[0] for _ in range(count)]

    def close(self) -> None:
        self.call.cancel()
        self.thread.join(timeout=10)


def changes(hub: Hub) -> None:
    """v2 (moves latest), tag stable -> v1, untag stable, revoke v1."""
    (hub.src / "b.txt").write_bytes(b"two")
    publish(hub.data, "f3", hub.src)
    with Catalog(hub.data / "catalog") as catalog:
        catalog.set_tag("f3", "stable", "v1")
        catalog.remove_tag("f3", "stable")
        catalog.revoke("f3", "v1")


def test_watch_replays_history_then_follows(hub: Hub) -> None:
    collector = Collector(hub.stub, hub_pb2.WatchRequest(after_sequence=0))
    try:
        history = collector.take(2)
        assert [(e.sequence, e.kind, e.version, e.tag) for e in history] == [
            (1, PUBLISHED, "v1", ""),
            (2, MOVED, "v1", "latest"),
        ]
        assert len(history[0].snapshot_id) == 32
        changes(hub)
        live = collector.take(5)
    finally:
        collector.close()
    assert [e.sequence for e in live] == [3, 4, 5, 6, 7]
    assert [(e.kind, e.version, e.tag, e.previous_version) for e in live] == [
        (PUBLISHED, "v2", "", ""),
        (MOVED, "v2", "latest", "v1"),
        (MOVED, "v1", "stable", ""),
        (REMOVED, "", "stable", "v1"),
        (REVOKED, "v1", "", ""),
    ]


def test_resume_after_disconnect_misses_nothing(hub: Hub) -> None:
    listing = hub.stub.ListDatasets(hub_pb2.ListDatasetsRequest(), timeout=RPC_TIMEOUT)
    assert listing.sequence == 2
    first = Collector(hub.stub, hub_pb2.WatchRequest(after_sequence=listing.sequence))
    (hub.src / "b.txt").write_bytes(b"two")
    publish(hub.data, "f3", hub.src)
    seen = first.take(1)
    first.close()  # disconnect after one event; one more is already committed
    with Catalog(hub.data / "catalog") as catalog:
        catalog.set_tag("f3", "stable", "v2")
        catalog.revoke("f3", "v1")
    resumed = Collector(hub.stub, hub_pb2.WatchRequest(after_sequence=seen[-1].sequence))
    try:
        rest = resumed.take(3)
    finally:
        resumed.close()
    sequences = [e.sequence for e in seen + rest]
    assert sequences == list(range(3, 7)), "gap-free and in order across the reconnect"
    assert [e.kind for e in rest] == [MOVED, MOVED, REVOKED]
    assert rest[0].tag == "latest" and rest[1].tag == "stable"


def test_dataset_filter(hub: Hub) -> None:
    other = write_tree(hub.data.parent / "other", {"x": b"x"})
    collector = Collector(hub.stub, hub_pb2.WatchRequest(after_sequence=2, datasets=["other"]))
    try:
        publish(hub.data, "f3", hub.src)
        publish(hub.data, "other", other)
        events = collector.take(2)
    finally:
        collector.close()
    assert {e.dataset for e in events} == {"other"}
    assert [e.sequence for e in events] == [5, 6], "other datasets' events are skipped"


def test_publish_by_another_process_reaches_watchers_within_2_s(hub: Hub) -> None:
    collector = Collector(hub.stub, hub_pb2.WatchRequest(after_sequence=2))
    (hub.src / "b.txt").write_bytes(b"from another process")
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "hub",
                "publish",
                "--data-dir",
                str(hub.data),
                "f3",
                str(hub.src),
            ],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        event, arrived_ns = collector.events.get(timeout=10)
    finally:
        collector.close()
    assert (event.kind, event.version) == (PUBLISHED, "v2")
    # event.time_ns is the commit time recorded by the publishing process (same clock).
    assert arrived_ns - event.time_ns < 2_000_000_000


def test_pruned_history_is_out_of_range(hub: Hub) -> None:
    publish(hub.data, "f3", hub.src)
    with Catalog(hub.data / "catalog") as catalog:
        assert catalog.prune_events(2) == 2
        assert catalog.first_sequence() == 3
    with pytest.raises(grpc.RpcError) as caught:
        list(hub.stub.Watch(hub_pb2.WatchRequest(after_sequence=0), timeout=RPC_TIMEOUT))
    assert caught.value.code() == grpc.StatusCode.OUT_OF_RANGE
    assert "were pruned" in caught.value.details()
    collector = Collector(hub.stub, hub_pb2.WatchRequest(after_sequence=2))
    try:
        assert [e.sequence for e in collector.take(1)] == [3]
    finally:
        collector.close()


def test_shutdown_ends_watch_streams_with_ok(tmp_path: Path) -> None:
    publish(tmp_path / "data", "f3", write_tree(tmp_path / "src", {"a": b"a"}))
    server = ServerThread(tmp_path / "data", grace=5.0).start()
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        collector = Collector(hub_pb2_grpc.HubStub(channel), hub_pb2.WatchRequest())
        assert collector.take(2)
        started = time.monotonic()
        server.stop()
        collector.thread.join(timeout=10)
        assert not collector.thread.is_alive()
        assert collector.error is None, "the stream ended with OK, not an error"
        assert time.monotonic() - started < 5.0, "watchers do not hold the grace period"


def test_publish_durations_reach_metrics(hub: Hub) -> None:
    collector = Collector(hub.stub, hub_pb2.WatchRequest(after_sequence=2))
    try:
        publish(hub.data, "f3", hub.src)
        collector.take(1)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            count = hub.metrics.registry.get_sample_value(
                "strata_hub_publish_duration_seconds_count"
            )
            if count:
                break
            time.sleep(0.05)
    finally:
        collector.close()
    assert count == 1
    assert (
        hub.metrics.registry.get_sample_value(
            "strata_hub_catalog_events_total", {"kind": "version_published"}
        )
        == 1
    )
