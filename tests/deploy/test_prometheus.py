"""deploy/prometheus: rules checked and unit-tested by promtool, and Debian's real
Prometheus scraping a running hub and spoke, read back through its HTTP API."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from deploy.local import drop_page_cache
from tests.deploy.conftest import Live
from tests.deploy.prom_support import PROMETHEUS_DIR, Prometheus, rules
from tests.support import eventually

pytestmark = pytest.mark.skipif(
    shutil.which("promtool") is None or shutil.which("prometheus") is None,
    reason="promtool/prometheus are not installed (Debian package prometheus)",
)


def _promtool(*args: str, cwd: Path = PROMETHEUS_DIR) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["promtool", *args], capture_output=True, text=True, cwd=cwd, timeout=120, check=False
    )


def test_rules_check() -> None:
    result = _promtool("check", "rules", "rules.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


TEST_FILES = sorted(p.name for p in PROMETHEUS_DIR.glob("rules_test*.yml"))


def test_rules_unit_tests() -> None:
    assert len(TEST_FILES) >= 3, TEST_FILES
    result = _promtool("test", "rules", *TEST_FILES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(TEST_FILES), result.stdout


def _cases() -> list[dict[str, Any]]:
    return [
        case
        for name in TEST_FILES
        for test in yaml.safe_load((PROMETHEUS_DIR / name).read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    ]


def test_every_alert_has_a_unit_test() -> None:
    """Each alert is seen firing, with its exact labels, and seen quiet (pending, or
    suppressed by what it waits for) in at least one case."""
    alerts = {rule["alert"] for rule in rules() if "alert" in rule}
    firing = {case["alertname"] for case in _cases() if case.get("exp_alerts")}
    quiet = {case["alertname"] for case in _cases() if not case.get("exp_alerts")}
    assert alerts == firing
    assert alerts - quiet == set(), "alerts never tested quiet"


def test_a_wrong_expectation_fails(tmp_path: Path) -> None:
    """promtool test rules fails on one wrong label: the unit tests can fail."""
    shutil.copy(PROMETHEUS_DIR / "rules.yml", tmp_path / "rules.yml")
    text = (PROMETHEUS_DIR / "rules_test_paging.yml").read_text()
    wrong = text.replace('instance: "r1:9464"}', 'instance: "r2:9464"}', 1)
    assert wrong != text
    (tmp_path / "rules_test.yml").write_text(wrong)
    result = _promtool("test", "rules", "rules_test.yml", cwd=tmp_path)
    assert result.returncode != 0, result.stdout
    assert "FAILED" in result.stdout + result.stderr


def test_config_check(tmp_path: Path) -> None:
    shutil.copytree(PROMETHEUS_DIR, tmp_path / "p")
    (tmp_path / "p" / "targets").mkdir()
    for name in ("hub.yml", "spokes.yml", "nodes.yml", "alertmanagers.yml"):
        (tmp_path / "p" / "targets" / name).write_text("- targets: ['127.0.0.1:1']\n")
    result = _promtool("check", "config", "prometheus.yml", cwd=tmp_path / "p")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stdout + result.stderr


def _metrics(url: str) -> str:
    response = httpx.get(url, timeout=10)
    response.raise_for_status()
    return response.text


def _sample(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


@pytest.mark.fuse
def test_prometheus_scrapes_hub_and_spoke(live: Live, tmp_path: Path) -> None:
    # the spoke's metrics port, as deploy/prometheus/prometheus.yml scrapes it (never
    # its admin API, which is loopback-only and wants a token)
    spoke_metrics = f"http://{live.spoke_metrics}/metrics"
    hub_metrics = f"http://{live.hub_metrics}/metrics"
    spoke_address = live.spoke_metrics
    prometheus = Prometheus(tmp_path, hub=[live.hub_metrics], spokes=[spoke_address])
    with prometheus.running():
        # read after a first scrape, so that the rate rules see the counters move
        eventually(lambda: bool(prometheus.query('up{job="strata-spoke"} == 1')), "a first scrape")
        root = live.mount / "demo" / "v1"
        for name, data in live.files.items():  # cold: misses (and prefetch)
            assert (root / name).read_bytes() == data
        if not drop_page_cache():
            pytest.skip("cannot drop the page cache (not root): the second read would not hit")
        for name, data in live.files.items():  # warm: hits from the spoke's disk
            assert (root / name).read_bytes() == data
        eventually(
            lambda: _sample(_metrics(spoke_metrics), "strata_spoke_cache_hits_total") > 0, "hits"
        )

        def caught_up() -> bool:
            text = _metrics(spoke_metrics)
            hits = prometheus.query('strata_spoke_cache_hits_total{job="strata-spoke"}')
            ratio = prometheus.query("strata:spoke_cache_used:ratio")
            used = _sample(text, "strata_spoke_cache_used_bytes")
            capacity = _sample(text, "strata_spoke_cache_capacity_bytes")
            return (
                len(hits) == 1
                and float(hits[0]["value"][1]) == _sample(text, "strata_spoke_cache_hits_total")
                and len(ratio) == 1
                and float(ratio[0]["value"][1]) == used / capacity
            )

        eventually(caught_up, "Prometheus has the spoke's hits and the cache-use recording rule")
        (hits,) = prometheus.query('strata_spoke_cache_hits_total{job="strata-spoke"}')
        assert hits["metric"]["instance"] == spoke_address
        assert hits["metric"]["node"] == "127.0.0.1"  # the relabelling in prometheus.yml
        served = _sample(_metrics(hub_metrics), "strata_hub_blocks_served_bytes_total")
        assert served >= sum(len(d) for d in live.files.values())
        eventually(
            lambda: [float(s["value"][1]) for s in prometheus.query(
                'strata_hub_blocks_served_bytes_total{job="strata-hub"}')] == [served],
            "the hub's served bytes",
        )  # fmt: skip
        (up,) = prometheus.query('up{job="strata-hub"}')
        assert up["value"][1] == "1"

        def hit_ratio() -> list[float]:
            return [float(s["value"][1]) for s in prometheus.query("strata:spoke_hit_ratio:rate5m")]

        # the rule is evaluated on its own clock: a first value may predate the scrape that
        # saw the hits (0 then, the misses having moved); it must come to (0, 1]
        eventually(lambda: len(ratios := hit_ratio()) == 1 and ratios[0] > 0, "a hit ratio above 0")
        assert 0 < hit_ratio()[0] <= 1
        alerts = httpx.get(f"{prometheus.url}/api/v1/rules", timeout=10).json()
        loaded = {r["name"] for g in alerts["data"]["groups"] for r in g["rules"]}
        assert loaded == {rule.get("alert", rule.get("record")) for rule in rules()}
        firing = [r["name"] for g in alerts["data"]["groups"] for r in g["rules"]
                  if r.get("state") == "firing"]  # fmt: skip
        assert firing == [], "a healthy hub and spoke fire no alert"
