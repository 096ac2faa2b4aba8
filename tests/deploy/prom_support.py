"""Metric names the running code exports, and a real Prometheus server for tests."""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from deploy.local import free_port, stop_process
from tests.conftest import REPO_ROOT
from tests.support import eventually

PROMETHEUS_DIR = REPO_ROOT / "deploy" / "prometheus"


def ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> bool:
    """Whether ``url`` (a ``/-/ready`` endpoint) answers 200 now.

    Raises:
        AssertionError: ``proc``, the server, has exited (the message: its log's tail).
    """
    assert proc.poll() is None, log.read_text()[-2000:]
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(url, timeout=2).status_code == 200
    return False


PENDING: dict[str, str] = {}
"""Metrics the rules and the dashboard use that other work adds (names agreed in the
project notes). Each must not be exported yet — a test fails when one is, so this list
shrinks as the work lands."""

_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_count", "_sum"),
    "summary": ("_count", "_sum", ""),
    "gauge": ("",),
    "info": ("_info",),
    "unknown": ("",),
}


def exported_names(*metrics_text: str) -> set[str]:
    """Sample names a Prometheus scrape of these /metrics pages can see, including the
    families that have no sample yet (a labelled counter nobody incremented)."""
    names = set()
    for text in metrics_text:
        for family in text_string_to_metric_families(text):
            names.update(family.name + s for s in _SUFFIXES.get(family.type, ("",)))
            names.update(sample.name for sample in family.samples)
    return names


def metric_names(expr: str) -> set[str]:
    """The ``strata_*`` metric names in a PromQL expression (label values and strings
    stripped first)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    return set(re.findall(r"\bstrata_[a-z0-9_]+\b", expr))


def recorded_names(expr: str) -> set[str]:
    """The recording-rule names (``strata:...``) a PromQL expression uses."""
    return set(re.findall(r"\bstrata:[a-z0-9_:]+\b", expr))


def rules() -> list[dict[str, Any]]:
    """Every rule of deploy/prometheus/rules.yml."""
    groups = yaml.safe_load((PROMETHEUS_DIR / "rules.yml").read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


class Prometheus:
    """Debian's ``prometheus`` on 127.0.0.1 with deploy/prometheus's configuration, the
    targets given and every interval shortened to 1 s (a copy in ``directory``)."""

    def __init__(
        self, directory: Path, hub: list[str], spokes: list[str], nodes: Sequence[str] = ()
    ) -> None:
        config_dir = directory / "config"
        shutil.copytree(PROMETHEUS_DIR, config_dir)
        config = yaml.safe_load((config_dir / "prometheus.yml").read_text())
        config["global"].update(scrape_interval="1s", evaluation_interval="1s")
        (config_dir / "prometheus.yml").write_text(yaml.safe_dump(config))
        groups = yaml.safe_load((config_dir / "rules.yml").read_text())
        for group in groups["groups"]:
            group.pop("interval", None)
        (config_dir / "rules.yml").write_text(yaml.safe_dump(groups))
        (config_dir / "targets").mkdir()
        (config_dir / "targets" / "hub.yml").write_text(yaml.safe_dump([{"targets": hub}]))
        (config_dir / "targets" / "spokes.yml").write_text(yaml.safe_dump([{"targets": spokes}]))
        for name, targets in (("nodes.yml", list(nodes)), ("alertmanagers.yml", [])):
            (config_dir / "targets" / name).write_text(yaml.safe_dump([{"targets": targets}]))
        self.config = config_dir / "prometheus.yml"
        self.url = f"http://127.0.0.1:{free_port()}"
        self._args = [
            "prometheus",
            f"--config.file={self.config}",
            f"--storage.tsdb.path={directory / 'tsdb'}",
            f"--web.listen-address={self.url.removeprefix('http://')}",
            "--log.level=warn",
        ]
        self._log = directory / "prometheus.log"

    @contextlib.contextmanager
    def running(self, timeout: float = 60.0) -> Iterator[Prometheus]:
        """Starts the server, waits for /-/ready, and stops it (SIGTERM, then SIGKILL)."""
        with open(self._log, "wb") as log:
            proc = subprocess.Popen(self._args, stdout=log, stderr=subprocess.STDOUT)
        try:
            eventually(
                lambda: ready(f"{self.url}/-/ready", proc, self._log), "prometheus ready", timeout
            )
            yield self
        finally:
            stop_process(proc, group=False)

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query; returns the result vector."""
        response = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        response.raise_for_status()
        body = response.json()
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result
