"""deploy/grafana/strata.json: fresh from deploy.dashboard, laid out on Grafana's grid,
and every expression valid PromQL (promtool) naming only metrics the running hub and
spoke export (or the agreed pending ones) and recording rules that exist."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from deploy.dashboard import OUTPUT, render
from tests.deploy.conftest import Live
from tests.deploy.prom_support import PENDING, exported_names, metric_names, recorded_names, rules

VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$node": ".*"}
QUESTIONS = [
    "Is the GPU fed?",
    "Is the link full?",
    "How warm is the cache?",
    "Is the region's mesh sharing?",
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
