"""The hub benchmarks run with one command (tiny sizes here; the numbers are not checked)."""

from __future__ import annotations

import json
from pathlib import Path

from bench import hub_large_tree, hub_throughput


def test_large_tree_benchmark_runs(tmp_path: Path) -> None:
    out = tmp_path / "large.json"
    assert hub_large_tree.main(["--files", "300", "--dirs", "3", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["manifest_entries"] == 303 and result["manifest_in_path_order"]
    assert result["directory_entries"] == 100
    assert result["directory_entries_decoded"] == 101, "one directory, not the manifest"
    assert result["publish_peak_rss_bytes"] > 0


def test_throughput_benchmark_runs(tmp_path: Path) -> None:
    out = tmp_path / "throughput.json"
    argv = ["--size-mib", "8", "--block-mib", "1", "--clients", "1,2", "--rounds", "1"]
    assert hub_throughput.main([*argv, "--cache", "warm", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    assert [(row["cache"], row["clients"]) for row in rows] == [("warm", 1), ("warm", 2)]
    assert all(row["hub_mb_s"] > 0 and row["disk_mb_s"] > 0 for row in rows)
