"""Two spokes of one region, each with its kernel mount, read the same file: the hub
serves each of its blocks once in total (counted by the hub's own metric)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import httpx
import pytest

from deploy.local import LocalStack, admin_headers, free_port
from deploy.pki import region_flags
from tests.integration.mesh_support import metric, wait_until
from tests.support import publish, requires_fuse, sha256

pytestmark = [pytest.mark.fuse, requires_fuse, pytest.mark.timeout(240)]

BLOCK = 65_536
BLOCKS = 24


def test_two_mounts_on_two_spokes_one_hub_fetch_per_block(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "shared.bin").write_bytes(os.urandom(BLOCKS * BLOCK))
    assert publish(tmp_path / "hub", "ds", src, "--block-size", str(BLOCK)) == "v1"
    with LocalStack() as stack:
        metrics_port = free_port()
        hub = stack.start_hub(  # plaintext: read grants need --insecure
            tmp_path / "hub", metrics=f"127.0.0.1:{metrics_port}", extra=("--insecure",)
        )
        ports = [free_port(), free_port()]
        peers = ",".join(f"127.0.0.1:{p}" for p in ports)
        secured = region_flags(tmp_path / "region")  # mTLS and a region token
        admins = [
            stack.start_spoke(
                hub,
                tmp_path / f"cache{i}",
                tmp_path / f"mnt{i}",
                "64MiB",
                extra=("--peer-listen", f"127.0.0.1:{port}", "--peers", peers, *secured),
            )
            for i, port in enumerate(ports)
        ]
        for i, admin in enumerate(admins):
            auth = admin_headers(tmp_path / f"cache{i}")
            wait_until(
                lambda a=admin, h=auth: (  # type: ignore[misc]
                    (mesh := httpx.get(f"{a}/v1/cache", headers=h, timeout=5).json()["mesh"])[
                        "nodes_live"
                    ]
                    == 2
                    and mesh["grant"]["valid"]
                ),
                f"{admin} sees both spokes and has a read grant",
            )
        digests: dict[int, str] = {}

        def read(i: int) -> None:
            digests[i] = sha256(tmp_path / f"mnt{i}" / "ds" / "v1" / "shared.bin")

        threads = [threading.Thread(target=read, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        want = sha256(src / "shared.bin")
        assert digests == {0: want, 1: want}
        hub_metrics = f"http://127.0.0.1:{metrics_port}/metrics"
        # the hub counts a block once its stream has sent it, which may come a moment after
        # the spoke has it (make test with three workers read 19 of 24); then exactly once
        wait_until(
            lambda: metric(hub_metrics, "strata_hub_blocks_served_total") >= BLOCKS,
            "the hub to count every block it sent",
        )
        assert metric(hub_metrics, "strata_hub_blocks_served_total") == BLOCKS
        peer = sum(
            metric(
                f"{a}/metrics",
                "strata_spoke_source_bytes_total",
                admin_headers(tmp_path / f"cache{i}"),
                source="peer",
            )
            for i, a in enumerate(admins)
        )
        assert peer == BLOCKS * BLOCK  # every block reached the spoke not owning it by peer
