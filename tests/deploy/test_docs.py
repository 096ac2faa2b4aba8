"""docs/deploy.md against what it ships: the keys it makes land in a git-ignored
directory, and every alert's runbook_url names a section there with symptoms, checks
(commands) and fixes."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.conftest import REPO_ROOT
from tests.deploy.prom_support import rules

DOCS = REPO_ROOT / "docs" / "deploy.md"


def _keys_directory() -> str:
    """The directory step 2 makes the CA and the keys in (its first ``mkdir``)."""
    match = re.search(r"mkdir -p (\S+?)\)? && cd (\S+)", DOCS.read_text())
    assert match, "step 2 makes no directory for the keys"
    assert match[1] == match[2]
    return match[1]


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_keys_are_made_in_an_ignored_directory() -> None:
    directory = _keys_directory()
    for name in ("ca.key", "hub.key", "spoke.key", "peer-ca.key", "tokens.yaml", "hub-token"):
        ignored = subprocess.run(
            ["git", "check-ignore", "-q", f"{directory}/{name}"],
            cwd=REPO_ROOT,
            check=False,
            timeout=30,
        )
        assert ignored.returncode == 0, f"{directory}/{name} is not git-ignored"
    assert not re.search(r"(?<![\w/.-])pki/", DOCS.read_text()), "a pki/ path is left"


def _sections() -> dict[str, str]:
    """docs/deploy.md's level-4 sections by GitHub's anchor (the heading in lower case,
    spaces as dashes), each its text up to the next heading."""
    found: dict[str, str] = {}
    parts = re.split(r"^(#{1,4}) (.+)$", DOCS.read_text(), flags=re.MULTILINE)
    for level, heading, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
        if level == "####":
            found[heading.strip().lower().replace(" ", "-")] = body
    return found


def test_every_alert_has_a_runbook_section() -> None:
    """Each alert's runbook_url is ``docs/deploy.md#<its name>``, a section there with
    Symptoms, Checks (a shell block of commands) and Fixes, in that order; no alert keeps
    the old one-cell ``runbook`` annotation."""
    sections = _sections()
    alerts = [rule for rule in rules() if "alert" in rule]
    assert alerts
    for rule in alerts:
        name, annotations = rule["alert"], rule["annotations"]
        assert "runbook" not in annotations, name
        path, _, anchor = annotations["runbook_url"].partition("#")
        assert path == "docs/deploy.md" and anchor == name.lower(), name
        assert anchor in sections, f"no section #### {name} in docs/deploy.md"
        body = sections[anchor]
        marks = [body.find(f"**{mark}") for mark in ("Symptoms", "Checks", "Fixes")]
        assert -1 not in marks and marks == sorted(marks), f"{name}: {marks}"
        checks = body[marks[1] : marks[2]]
        assert re.search(r"```sh\n.*\S.*\n```", checks, flags=re.DOTALL), f"{name}: no commands"
