"""The demo's flow, end to end: real F3 SEG-Y → MDIO → hub → spoke → FUSE mount → trainer."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from deploy.local import LocalStack, admin_headers, drop_page_cache
from tests.support import eventually, publish, requires_fuse, tree_digests

pytestmark = [pytest.mark.e2e, pytest.mark.fuse, requires_fuse]


def _fit(data: Path, out: Path, steps: int) -> dict[str, float]:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer",
            "fit",
            "--data",
            str(data),
            "--steps",
            str(steps),
            "--preset",
            "tiny",
            "--batch-size",
            "8",
            "--workers",
            "0",
            "--out",
            str(out),
        ],
        check=True,
    )
    summary: dict[str, float] = json.loads((out / "summary.json").read_text())
    return summary


def test_f3_through_the_mount(seismic: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer",
            "prepare",
            "--segy",
            str(seismic / "f3.sgy"),
            "--out",
            str(src / "f3.mdio"),
        ],
        check=True,
    )
    assert publish(tmp_path / "hub", "f3", src) == "v1"
    with LocalStack() as stack:
        hub = stack.start_hub(tmp_path / "hub")
        admin = stack.start_spoke(hub, tmp_path / "cache", tmp_path / "mnt", "256MiB")
        data = tmp_path / "mnt" / "f3" / "latest" / "f3.mdio"
        assert tree_digests(data) == tree_digests(src / "f3.mdio")

        first = _fit(data, tmp_path / "train1", steps=40)
        assert math.isfinite(first["loss_first"]) and math.isfinite(first["loss_last"])
        log = [json.loads(line) for line in (tmp_path / "train1" / "metrics.jsonl").open()]
        losses = [row["loss"] for row in log]
        assert sum(losses[-10:]) / 10 < sum(losses[:10]) / 10, losses
        warm = httpx.get(f"{admin}/v1/cache", headers=admin_headers(tmp_path / "cache")).json()
        assert warm["hub_fetch_bytes"] > 0 and warm["misses"] > 0

        drop_page_cache()  # when root: make pass 2 reach the mount
        _fit(data, tmp_path / "train2", steps=10)
        headers = admin_headers(tmp_path / "cache")

        def counted() -> dict[str, int] | None:  # hits are reported in batches
            now: dict[str, int] = httpx.get(f"{admin}/v1/cache", headers=headers).json()
            return now if now["hits"] > warm["hits"] else None

        again = eventually(counted, "pass 2's hits reported", 5)
        assert again["hub_fetch_bytes"] == warm["hub_fetch_bytes"]
        assert again["misses"] == warm["misses"]
        assert again["hits"] > warm["hits"]


def test_demo_splits_a_two_epoch_run_by_epoch(tmp_path: Path) -> None:
    """The demo's per-epoch figures come from the trainer's metrics.jsonl: each epoch's
    wall from the previous epoch's last step (epoch 0 from the DataLoader's start)."""
    from demo.epochs import epochs_of

    lines = [{"step": s, "epoch": (s - 1) // 3, "elapsed_s": e} for s, e in
             zip(range(1, 7), (4.0, 5.0, 6.0, 6.5, 7.0, 7.5), strict=True)]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    epochs = epochs_of(tmp_path, batch_size=8)
    assert [(e["epoch"], e["wall_s"], e["samples"]) for e in epochs] == [(0, 6.0, 24), (1, 1.5, 24)]
    assert epochs[1]["samples_per_s"] == 16.0 and epochs[1]["start_s"] == 6.0
