"""Reads through the mount with block bytes on the bulk channel (``--hub-bulk-port``):
every byte right, and every byte came over the bulk port, not gRPC."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from deploy.local import LocalStack, free_port
from tests.support import publish, requires_fuse

pytestmark = [pytest.mark.fuse, requires_fuse]


def _metric(url: str, name: str) -> float:
    text = httpx.get(url, timeout=5).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    )


@pytest.fixture
def stack() -> Iterator[LocalStack]:
    with LocalStack() as s:
        yield s


@pytest.mark.parametrize("workers", [1, 3])
def test_reads_over_the_bulk_channel(tmp_path: Path, stack: LocalStack, workers: int) -> None:
    src = tmp_path / "src"
    src.mkdir()
    sizes = [0, 1, 65_535, 65_536, 65_537, 1 << 20, 3 * (1 << 20) + 7]
    want = {f"f{i}.bin": os.urandom(size) for i, size in enumerate(sizes * 2)}
    for name, data in want.items():
        (src / name).write_bytes(data)
    assert publish(tmp_path / "hub", "ds", src, "--block-size", "65536") == "v1"
    metrics_port = free_port()
    bulk_file = tmp_path / "bulk.port"
    hub = stack.start_hub(
        tmp_path / "hub",
        metrics=f"127.0.0.1:{metrics_port}",
        extra=("--bulk-port", "0", "--bulk-port-file", str(bulk_file)),
    )
    extra = ("--hub-bulk-port", bulk_file.read_text().strip(), "--fetch-workers", str(workers))
    mnt = tmp_path / "mnt"
    stack.start_spoke(hub, tmp_path / "cache", mnt, "64MiB", extra=extra)
    root = mnt / "ds" / "v1"
    for name, data in want.items():
        assert (root / name).read_bytes() == data, name
    hub_metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    served = _metric(hub_metrics, "strata_hub_blocks_served_bytes_total")
    assert served >= sum(sizes)  # every distinct block at least once (fill may add more)
    assert _metric(hub_metrics, "strata_hub_bulk_bytes_total") == served, "no byte over gRPC"
    # a second pass is served from the cache: bytes identical, nothing more from the hub
    for name, data in want.items():
        assert (root / name).read_bytes() == data, name


def test_a_receive_thread_takes_larger_blocks_after_smaller_ones(
    tmp_path: Path, stack: LocalStack
) -> None:
    """4 MiB blocks, one receive thread, files read smallest first: the thread's buffer
    grows for each larger block (a new user's first try failed every block after the
    first growth with "mmap closed or invalid", and every such file with EIO)."""
    src = tmp_path / "src"
    src.mkdir()
    sizes = [6, 3 * (1 << 20) + 7, 3 * (1 << 20) + 12_345, (4 << 20) + (4 << 19), 4 << 20]
    want = {f"f{i}.bin": os.urandom(size) for i, size in enumerate(sizes)}
    for name, data in want.items():
        (src / name).write_bytes(data)
    assert publish(tmp_path / "hub", "ds", src) == "v1"
    bulk_file = tmp_path / "bulk.port"
    hub = stack.start_hub(
        tmp_path / "hub", extra=("--bulk-port", "0", "--bulk-port-file", str(bulk_file))
    )
    metrics_port = free_port()
    extra = ("--hub-bulk-port", bulk_file.read_text().strip(), "--fetch-workers", "1")
    extra += ("--background-fill", "off", "--miss-deadline", "10")
    extra += ("--metrics", f"127.0.0.1:{metrics_port}")
    mnt = tmp_path / "mnt"
    stack.start_spoke(hub, tmp_path / "cache", mnt, "64MiB", extra=extra)
    root = mnt / "ds" / "v1"
    for name, data in want.items():  # in size order: the buffer grows at every file
        assert (root / name).read_bytes() == data, name
    spoke_metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    bulk = _metric(spoke_metrics, "strata_spoke_hub_bulk_bytes_total")
    assert bulk == _metric(spoke_metrics, "strata_spoke_hub_fetch_bytes_total") == sum(sizes)


def test_readyz_names_an_unreachable_bulk_channel(tmp_path: Path, stack: LocalStack) -> None:
    """A --hub-bulk-port nobody listens on: the hub's gRPC answers (the catalog works),
    but no block can come; /readyz says so, naming the bulk channel, not just "hub
    unreachable"."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(b"a" * 1000)
    assert publish(tmp_path / "hub", "ds", src) == "v1"
    hub = stack.start_hub(tmp_path / "hub")
    closed = str(free_port())
    admin = stack.start_spoke(
        hub, tmp_path / "cache", tmp_path / "mnt", "64MiB", extra=("--hub-bulk-port", closed)
    )
    ready = httpx.get(f"{admin}/readyz", timeout=5)
    assert ready.status_code == 503, ready.text
    detail = ready.json()["detail"]
    assert "bulk channel failed" in detail and f":{closed}" in detail, detail
