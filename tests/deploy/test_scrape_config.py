"""deploy/prometheus/prometheus.yml outside Kubernetes scrapes what the systemd units
serve for it: the hub's and the spoke's metrics ports, never the spoke's admin API (on
127.0.0.1 only, behind a token: a scrape of it would fail, or need the token in
Prometheus)."""

from __future__ import annotations

import re

import yaml

from tests.conftest import REPO_ROOT
from tests.deploy.prom_support import PROMETHEUS_DIR
from tests.deploy.systemd_support import directives

UNITS = REPO_ROOT / "deploy" / "systemd"


def _environment(unit: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in (UNITS / unit).read_text().splitlines():
        if line.startswith("Environment="):
            for pair in line.removeprefix("Environment=").split():
                key, _, value = pair.partition("=")
                found[key] = value
    return found


def _example_targets() -> dict[str, list[str]]:
    """The targets the file's header says to put in each targets/*.yml."""
    text = (PROMETHEUS_DIR / "prometheus.yml").read_text()
    return {
        name: re.findall(r'"([^"]+)"', targets)
        for name, targets in re.findall(r"targets/(\w+)\.yml\s+- targets: \[([^\]]*)\]", text)
    }


def test_targets_are_the_units_metrics_ports() -> None:
    hub, spoke = _environment("strata-hub.service"), _environment("strata-spoke.service")
    metrics_port = {
        "hub": hub["STRATA_HUB_METRICS"].rpartition(":")[2],
        "spokes": spoke["STRATA_METRICS"].rpartition(":")[2],
    }
    admin = spoke["STRATA_ADMIN"]
    assert admin.startswith("127.0.0.1:"), "the admin API is the node's own"
    assert not spoke["STRATA_METRICS"].startswith("127."), "Prometheus scrapes another host"
    # and each unit serves its metrics on that variable (the spoke's admin on its own)
    (hub_start,) = directives(UNITS / "strata-hub.service")["ExecStart"]
    (spoke_start,) = directives(UNITS / "strata-spoke.service")["ExecStart"]
    assert "--metrics=${STRATA_HUB_METRICS}" in hub_start
    assert "--metrics=${STRATA_METRICS}" in spoke_start
    assert "--admin=${STRATA_ADMIN}" in spoke_start
    examples = _example_targets()
    for job, port in metrics_port.items():
        assert examples[job], job
        for target in examples[job]:
            assert target.rpartition(":")[2] == port, f"{job}: {target} is not :{port}"
            assert target.rpartition(":")[2] != admin.rpartition(":")[2]


def test_every_target_file_is_scraped() -> None:
    """Each targets file the header describes is one a job (or the alerting section)
    reads, and each job reads one the header describes."""
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    files = {
        f
        for job in [*config["scrape_configs"], *config["alerting"]["alertmanagers"]]
        for sd in job.get("file_sd_configs", [])
        for f in sd["files"]
    }
    assert files == {f"targets/{name}.yml" for name in _example_targets()}
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    for name in ("strata-spoke", "node"):  # joined on `node` (StrataCacheDiskShort)
        (relabel,) = jobs[name]["relabel_configs"]
        assert relabel["target_label"] == "node"
