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
