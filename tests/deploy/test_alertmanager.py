"""deploy/alertmanager/alertmanager.yml: valid (amtool), pages only critical alerts, names
only alerts rules.yml has, and a real Alertmanager inhibits what it says: a region's
per-spoke hub alerts under the region's one, a spoke's mount restart under its
container's OOM kill, and nothing of another region or pod."""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from deploy.local import free_port, stop_process
from tests.conftest import REPO_ROOT
from tests.deploy.prom_support import ready, rules
from tests.support import eventually

CONFIG = REPO_ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
AMTOOL = shutil.which("amtool")
ALERTMANAGER = shutil.which("alertmanager") or shutil.which("prometheus-alertmanager")
needs_amtool = pytest.mark.skipif(
    AMTOOL is None, reason="amtool is not installed (Debian package prometheus-alertmanager)"
)


def _amtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert AMTOOL is not None
    return subprocess.run([AMTOOL, *args], capture_output=True, text=True, timeout=60, check=False)


@needs_amtool
def test_config_checks() -> None:
    result = _amtool("check-config", str(CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@needs_amtool
@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        (["alertname=StrataHubDown", "severity=critical"], "strata-page"),
        (["alertname=StrataHubUnreachableFromRegion", "severity=critical"], "strata-page"),
        (["alertname=StrataHubReplicaDown", "severity=warning"], "strata-ticket"),
        (["alertname=StrataFillStalled", "severity=warning"], "strata-ticket"),
    ],
)
def test_only_critical_alerts_page(labels: list[str], receiver: str) -> None:
    result = _amtool("config", "routes", "test", f"--config.file={CONFIG}", *labels)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == receiver


def test_inhibitions_name_real_alerts() -> None:
    config = yaml.safe_load(CONFIG.read_text())
    alerts = {rule["alert"] for rule in rules() if "alert" in rule}
    named: set[str] = set()
    for rule in config["inhibit_rules"]:
        for matcher in rule["source_matchers"] + rule["target_matchers"]:
            match = re.fullmatch(r'alertname=~?"([^"]+)"', matcher)
            if match:
                named |= set(match[1].split("|"))
        assert {"cluster"} <= set(rule["equal"]), rule
    assert named and named <= alerts, sorted(named - alerts)


@contextlib.contextmanager
def _alertmanager(tmp_path: Path) -> Iterator[str]:
    assert ALERTMANAGER is not None
    url = f"http://127.0.0.1:{free_port()}"
    log = open(tmp_path / "alertmanager.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [
            ALERTMANAGER,
            f"--config.file={CONFIG}",
            f"--storage.path={tmp_path / 'data'}",
            f"--web.listen-address={url.removeprefix('http://')}",
            "--cluster.listen-address=",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        eventually(
            lambda: ready(f"{url}/-/ready", proc, tmp_path / "alertmanager.log"),
            "alertmanager ready",
        )
        yield url
    finally:
        stop_process(proc, group=False)
        log.close()


def _alert(**labels: str) -> dict[str, Any]:
    return {"labels": labels, "annotations": {}, "generatorURL": "http://prometheus/graph"}


@pytest.mark.skipif(ALERTMANAGER is None, reason="alertmanager is not installed")
def test_a_real_alertmanager_inhibits(tmp_path: Path) -> None:
    spoke = {"job": "strata-spoke", "cluster": "gpu"}
    expected = {  # name: inhibited
        "region-b": False,
        "b-n1": True,
        "b-fill": True,
        "c-n1": False,
        "oom-p1": False,
        "restart-p1": True,
        "restart-p2": False,
    }
    alerts = {
        "region-b": _alert(
            alertname="StrataHubUnreachableFromRegion", severity="critical", region="b", **spoke
        ),
        "b-n1": _alert(
            alertname="StrataHubUnreachable", severity="critical", region="b",
            instance="n1:9465", **spoke,
        ),
        "b-fill": _alert(
            alertname="StrataFillStalled", severity="warning", region="b",
            instance="n2:9465", **spoke,
        ),
        "c-n1": _alert(  # another region: its own alert
            alertname="StrataHubUnreachable", severity="critical", region="c",
            instance="n1:9465", **spoke,
        ),
        "oom-p1": _alert(
            alertname="StrataOOMKilled", severity="critical", cluster="gpu",
            namespace="strata", pod="strata-spoke-p1", container="spoke",
        ),
        "restart-p1": _alert(
            alertname="StrataMountRestarted", severity="critical", namespace="strata",
            pod="strata-spoke-p1", instance="10.0.0.1:9465", **spoke,
        ),
        "restart-p2": _alert(
            alertname="StrataMountRestarted", severity="critical", namespace="strata",
            pod="strata-spoke-p2", instance="10.0.0.2:9465", **spoke,
        ),
    }  # fmt: skip
    for name, alert in alerts.items():
        alert["labels"]["test"] = name
    with _alertmanager(tmp_path) as url:
        httpx.post(f"{url}/api/v2/alerts", json=list(alerts.values()), timeout=10)
        seen: list[dict[str, bool]] = []

        def inhibited() -> bool:
            got = httpx.get(f"{url}/api/v2/alerts", timeout=10).json()
            seen.append({a["labels"]["test"]: bool(a["status"]["inhibitedBy"]) for a in got})
            return seen[-1] == expected

        eventually(inhibited, lambda: f"inhibited {seen[-1]}, not {expected}", 20)
