"""A running hub and spoke (real processes, a kernel mount) shared by the deploy tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from deploy.local import LocalStack, free_port
from tests.support import fuse_available, publish


@dataclass(frozen=True)
class Live:
    """A hub with a metrics endpoint and a spoke mounting its dataset ``demo``, with its
    own metrics endpoint (``--metrics``, what Prometheus scrapes) beside its admin API."""

    hub: str
    hub_metrics: str
    admin: str
    spoke_metrics: str
    mount: Path
    files: dict[str, bytes]


@pytest.fixture(scope="session")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    reason = fuse_available()
    if reason is not None:
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("live")
    src = tmp / "src"
    src.mkdir()
    files = {"a.bin": os.urandom(200_000), "b.txt": b"hello strata\n"}
    for name, data in files.items():
        (src / name).write_bytes(data)
    assert publish(tmp / "hub", "demo", src, "--block-size", "65536") == "v1"
    metrics = f"127.0.0.1:{free_port()}"
    with LocalStack() as stack:
        hub = stack.start_hub(tmp / "hub", metrics=metrics)
        spoke_metrics = f"127.0.0.1:{free_port()}"
        extra = ("--metrics", spoke_metrics)
        admin = stack.start_spoke(hub, tmp / "cache", tmp / "mnt", "64MiB", extra=extra)
        yield Live(hub, metrics, admin, spoke_metrics, tmp / "mnt", files)
