"""checkov's Kubernetes checks on every rendered overlay: no finding outside the table in
docs/deploy.md ("What checkov finds, and why it stays"), and no row of it that no longer
happens. Runs where checkov is installed (``checkov`` on PATH, or ``$CHECKOV``)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO_ROOT
from tests.deploy.k8s_support import OVERLAYS, copy_tree, rendered

CHECKOV = os.environ.get("CHECKOV") or shutil.which("checkov")
DOCS = REPO_ROOT / "docs" / "deploy.md"
SECTION = "## What checkov finds, and why it stays"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHECKOV is None, reason="checkov is not installed (pip install checkov)"),
]


def documented(text: str) -> set[tuple[str, str]]:
    """``(check id, object)`` pairs of the section's table: every check of a row's first
    cell with every object of its second (each in backticks)."""
    body = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    pairs = set()
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`CKV"):
            continue
        checks = re.findall(r"`(CKV2?_K8S_\d+)`", cells[0])
        objects = re.findall(r"`([^`]+)`", cells[1])
        pairs |= {(check, obj) for check in checks for obj in objects}
    return pairs


def test_the_table_parses() -> None:
    """The parser reads the table the way it is written (this test can fail)."""
    pairs = documented(DOCS.read_text())
    assert ("CKV_K8S_16", "DaemonSet.strata.strata-spoke") in pairs
    assert ("CKV_K8S_43", "Job.strata-train.strata-train-f3") in pairs
    assert all(obj.count(".") >= 2 for _, obj in pairs), pairs


def test_no_finding_outside_the_documented_table(tmp_path: Path) -> None:
    root = copy_tree(tmp_path)
    files = []
    for overlay in OVERLAYS:
        path = tmp_path / f"{overlay}.yaml"
        path.write_text(yaml.safe_dump_all(rendered(root, overlay), sort_keys=False))
        files += ["-f", str(path)]
    assert CHECKOV is not None
    done = subprocess.run(
        [CHECKOV, *files, "--framework", "kubernetes", "--quiet", "--compact", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode in (0, 1), done.stderr[-2000:]
    reports = json.loads(done.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    found = {
        (failed["check_id"], failed["resource"])
        for report in reports
        for failed in report["results"]["failed_checks"]
    }
    passed = sum(report["summary"]["passed"] for report in reports)
    assert passed > 100, "checkov checked almost nothing: did the overlays render?"
    allowed = documented(DOCS.read_text())
    assert sorted(found - allowed) == [], "findings docs/deploy.md does not explain"
    assert sorted(allowed - found) == [], "rows of docs/deploy.md checkov no longer finds"
