"""Many readers missing small files at once: every byte right, and few hub streams.

Each miss used to be one ``EnsureBlocks`` call and one ``ReadBlocks`` stream of its own;
the mount now shares calls between concurrent small misses (``fusemount/misses.py``) and
the daemon shares streams between concurrent demand misses (``spoke/fetch/scheduler.py``).
"""

from __future__ import annotations

import math
import os
import random
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.wan import LinkSpec, WanProxy
from deploy.local import LocalStack, free_port
from tests.support import publish, requires_fuse

pytestmark = [pytest.mark.fuse, requires_fuse]

READERS = 8
FILES = 320
FILE_BYTES = 8192


def _metric(url: str, name: str, **labels: str) -> float:
    text = httpx.get(url, timeout=5).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


@pytest.fixture
def stack() -> Iterator[LocalStack]:
    with LocalStack() as s:
        yield s


def test_many_readers_missing_small_files_share_few_hub_streams(
    tmp_path: Path, stack: LocalStack
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    want = {}
    for i in range(FILES):
        data = os.urandom(FILE_BYTES)
        (src / f"f{i:04d}.bin").write_bytes(data)
        want[f"f{i:04d}.bin"] = data
    assert publish(tmp_path / "hub", "ds", src) == "v1"
    metrics_port = free_port()
    hub = stack.start_hub(tmp_path / "hub", metrics=f"127.0.0.1:{metrics_port}")
    hub_metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    host, port = hub.rsplit(":", 1)
    # a 20 ms round trip to the hub: misses of the other readers arrive while one is out
    with WanProxy((host, int(port)), LinkSpec(rtt_s=0.02, rate_bps=math.inf)) as wan:
        mnt = tmp_path / "mnt"
        stack.start_spoke(
            wan.address, tmp_path / "cache", mnt, "64MiB", extra=("--background-fill", "off")
        )
        root = mnt / "ds" / "v1"
        os.stat(root)  # the tree is loaded before the readers start
        before = _metric(hub_metrics, "strata_hub_requests_total", method="ReadBlocks")
        served_before = _metric(hub_metrics, "strata_hub_blocks_served_total")
        order = sorted(want)
        random.Random(7).shuffle(order)
        got: dict[str, bytes] = {}
        errors: list[BaseException] = []
        lock = threading.Lock()
        queue = iter(order)

        def reader() -> None:
            try:
                while True:
                    with lock:
                        name = next(queue, None)
                    if name is None:
                        return
                    with open(root / name, "rb") as f:
                        got[name] = f.read()
            except BaseException as err:
                errors.append(err)

        threads = [threading.Thread(target=reader) for _ in range(READERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert got == want
        streams = _metric(hub_metrics, "strata_hub_requests_total", method="ReadBlocks") - before
        served = _metric(hub_metrics, "strata_hub_blocks_served_total") - served_before
    assert served == FILES  # every block fetched once
    # one stream per miss would be FILES; readers that miss while a call is out share
    assert streams <= FILES // 2, f"{streams:.0f} ReadBlocks streams for {FILES} misses"
