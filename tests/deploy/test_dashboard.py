"""deploy/grafana/strata.json: fresh from deploy.dashboard, laid out on Grafana's grid,
and every expression valid PromQL (promtool) naming only metrics the running hub and
spoke export (or the agreed pending ones) and recording rules that exist."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from deploy.dashboard import OUTPUT, render
from tests.deploy.conftest import Live
from tests.deploy.k8s_support import K8S
from tests.deploy.prom_support import PENDING, exported_names, metric_names, recorded_names, rules

VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$node": ".*"}
QUESTIONS = [
    "Is the GPU fed?",
    "Is the link full?",
    "Is the hub serving?",
    "How warm is the cache?",
    "Is the region's mesh sharing?",
    "Are Strata's pods within their resources?",
    "Is anything wrong?",
]


def _dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(OUTPUT.read_text())
    return data


def expressions(board: dict[str, Any]) -> dict[str, str]:
    """Every PromQL expression in the dashboard, by where it is, variables filled in."""
    found: dict[str, str] = {}
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            found[f"panel {panel['title']!r} {target['refId']}"] = target["expr"]
    for note in board["annotations"]["list"]:
        found[f"annotation {note['name']!r}"] = note["expr"]
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            found[f"variable {var['name']}"] = var["definition"]
    for key, expr in found.items():
        for name, value in VARIABLES.items():
            expr = expr.replace(name, value)
        found[key] = expr
    return found


def test_committed_dashboard_is_fresh() -> None:
    assert OUTPUT.read_text() == render(), "run python -m deploy.dashboard"


def test_rows_and_grid() -> None:
    board = _dashboard()
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    assert rows == QUESTIONS
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        mine = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"])
                for y in range(pos["y"], pos["y"] + pos["h"])}  # fmt: skip
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine
    notes = {n["name"] for n in board["annotations"]["list"]}
    assert {"Evictions", "Cache full", "Mount restart", "Hub unreachable"} <= notes


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_every_expression_is_promql(tmp_path: Path) -> None:
    found = expressions(_dashboard())
    group = {"name": "dashboard", "rules": [
        {"record": f"dashboard:expr_{i}", "expr": e} for i, e in enumerate(found.values())
        if not e.startswith("label_values(")
    ]}  # fmt: skip
    (tmp_path / "dashboard.yml").write_text(yaml.safe_dump({"groups": [group]}))
    result = subprocess.run(
        ["promtool", "check", "rules", str(tmp_path / "dashboard.yml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_recording_rules_exist() -> None:
    recorded = {rule["record"] for rule in rules() if "record" in rule}
    for where, expr in expressions(_dashboard()).items():
        assert recorded_names(expr) <= recorded, where


@pytest.mark.fuse
def test_every_metric_is_exported(live: Live) -> None:
    exported = exported_names(
        httpx.get(f"http://{live.spoke_metrics}/metrics", timeout=10).text,
        httpx.get(f"http://{live.hub_metrics}/metrics", timeout=10).text,
    )
    rule_exprs = {f"rule {r.get('record', r.get('alert'))}": r["expr"] for r in rules()}
    for where, expr in {**expressions(_dashboard()), **rule_exprs}.items():
        missing = metric_names(expr) - exported - set(PENDING)
        assert not missing, f"{where} uses metrics nothing exports: {sorted(missing)}"


def _row(board: dict[str, Any], title: str) -> list[dict[str, Any]]:
    """The panels under the row ``title``."""
    panels: list[dict[str, Any]] = board["panels"]
    start = next(i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == title)
    rest = panels[start + 1 :]
    end = next((i for i, p in enumerate(rest) if p["type"] == "row"), len(rest))
    return rest[:end]


def test_hub_and_resource_panels() -> None:
    """The hub's row shows requests by code, bytes served, replicas and catalog up, limit
    refusals and streams; the resource row CPU, memory against the limit and the cache
    disk."""
    board = _dashboard()
    hub = " ".join(t["expr"] for p in _row(board, "Is the hub serving?") for t in p["targets"])
    for name in (
        "strata_hub_requests_total",
        "strata:hub_blocks_served_bytes:rate1m",
        "strata:hub_catalog_up:ratio",
        "strata:hub_replicas_up:ratio",
        "strata_hub_limit_refusals_total",
        "strata_hub_active_streams",
    ):
        assert name in hub, name
    assert "sum by (method, code)" in hub
    row = _row(board, "Are Strata's pods within their resources?")
    resources = " ".join(t["expr"] for p in row for t in p["targets"])
    for name in (
        "container_cpu_usage_seconds_total",
        "strata:container_memory_working_set:ratio_limit",
        "node_filesystem_avail_bytes",
        "strata_spoke_cache_capacity_bytes",
    ):
        assert name in resources, name


def test_node_picker_lists_node_names() -> None:
    """$node offers the spokes' ``node`` label (node names, which the ServiceMonitor and
    prometheus.yml set), and every panel filters on that label, never on a pod's address."""
    board = _dashboard()
    (node,) = [v for v in board["templating"]["list"] if v["name"] == "node"]
    assert node["definition"] == "label_values(strata_spoke_cache_used_bytes, node)"
    raw = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    raw += [note["expr"] for note in board["annotations"]["list"]]
    filtered = [expr for expr in raw if "$node" in expr]
    assert len(filtered) > 20
    for expr in filtered:
        assert re.search(r'\bnode=~"\$node"', expr), expr
        assert "instance=~" not in expr, expr
    monitor = yaml.safe_load((K8S / "base" / "spoke" / "servicemonitor.yaml").read_text())
    (endpoint,) = monitor["spec"]["endpoints"]
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in (
        endpoint["relabelings"]
    )
