"""README.md and docs/*.md send a reader only to files in the repository: every relative
Markdown link resolves to a file here (and its ``#anchor`` to a heading of that file, when
it is Markdown), and no path in backquotes names a design note outside the clone."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
OUTSIDE_NOTE = re.compile(r"`(?:\.\./|/)[^`\s]*\.md`")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def _anchors(markdown: Path) -> set[str]:
    """GitHub's anchors for ``markdown``'s headings: lower case, punctuation but ``-`` and
    ``_`` dropped, spaces as dashes."""
    text = FENCE.sub("", markdown.read_text())
    found = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


def _links(doc: Path) -> list[str]:
    return [m for m in LINK.findall(FENCE.sub("", doc.read_text())) if ":" not in m]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_relative_link_resolves_inside_the_repository(doc: Path) -> None:
    for link in _links(doc):
        path, _, anchor = link.partition("#")
        target = (doc.parent / path).resolve() if path else doc
        assert target.is_relative_to(REPO_ROOT), f"{doc.name}: {link} leaves the repository"
        assert target.exists(), f"{doc.name}: {link} names no file"
        if anchor and target.suffix == ".md":
            assert anchor in _anchors(target), f"{doc.name}: {link}: no such heading"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_no_design_note_outside_the_repository(doc: Path) -> None:
    assert not OUTSIDE_NOTE.findall(doc.read_text()), f"{doc.name} names a note outside"


def test_readme_links_the_design() -> None:
    assert "docs/design.md" in _links(REPO_ROOT / "README.md")
