"""Symlinks are judged where the kernel would take them on a mount, not by their text: a
target that climbs out through the snapshot's own links (``q -> .``, then
``q/q/../../etc/shadow``) is refused at publish, like an absolute one, unless
``--allow-external-symlinks``; loops are refused; dangling links that stay inside and
relative links within the tree publish as before."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hub.catalog import Catalog
from hub.cli.main import main
from hub.errors import SourceError
from hub.publish.symlinks import MAX_LINKS, escape
from hub.publish.tree import publish
from hub.snapshot.manifest import EntryType

CHAIN = "q/q/q/q/q/q/q/q/q/q/../../../../../../../../../../etc/shadow"
"""The probe's target: each ``q`` (``q -> .``) resolves to the root, so each ``..`` after
them climbs; by its text it ends in ``etc/shadow`` inside the tree."""

D, F, L = EntryType.DIRECTORY, EntryType.FILE, EntryType.SYMLINK


def _lookup(tree: dict[str, tuple[EntryType, str]]):  # type: ignore[no-untyped-def]
    return tree.get


TREE: dict[str, tuple[EntryType, str]] = {
    "q": (L, "."),
    "a.txt": (F, ""),
    "data": (D, ""),
    "data/big.bin": (F, ""),
    "sub": (D, ""),
    "sub/up": (L, ".."),
    "sub/deeper": (D, ""),
    "sub/deeper/up2": (L, "../.."),
    "abs": (L, "/etc"),
    "loop1": (L, "loop2"),
    "loop2": (L, "loop1"),
}


@pytest.mark.parametrize(
    ("link", "target", "why"),
    [
        ("shadow-link", CHAIN, "climbs above the snapshot's root after following 10"),
        ("x", "sub/up/..", "climbs above the snapshot's root after following 1"),
        ("sub/x", "deeper/up2/../../..", "climbs above"),
        ("x", "q/../..", "climbs above"),
        ("x", "/etc/shadow", "is absolute"),
        ("x", "abs/shadow", "passes through 'abs', which is absolute"),
        ("x", "loop1", f"does not resolve within {MAX_LINKS} symlinks"),
        ("self", "self", f"does not resolve within {MAX_LINKS} symlinks"),
    ],
)
def test_a_target_leaving_the_tree_when_resolved_is_found(link: str, target: str, why: str) -> None:
    tree = {**TREE, link: (L, target)}
    reason = escape(link, target, _lookup(tree))
    assert reason is not None and reason.startswith(why), reason


@pytest.mark.parametrize(
    ("link", "target"),
    [
        ("x", "a.txt"),
        ("sub/x", "../data/big.bin"),
        ("x", "q/q/q/data"),  # through links, staying inside
        ("x", "sub/up/a.txt"),  # sub/up is the root: inside
        ("sub/deeper/x", "up2/sub/up/data"),
        ("x", "missing/../../../etc/shadow"),  # dangling at "missing": never resolves
        ("x", "data/../missing/nowhere"),  # dangling, inside
        ("x", "a.txt/../../.."),  # ENOTDIR at a.txt: never resolves
        ("x", "."),
    ],
)
def test_a_target_that_stays_inside_or_never_resolves_is_allowed(link: str, target: str) -> None:
    tree = {**TREE, link: (L, target)}
    assert escape(link, target, _lookup(tree)) is None


def test_the_link_limit_is_linuxs() -> None:
    """A chain of 40 links ``l0 -> l1 -> ... -> l39 -> end`` resolves, as ``cat l0`` does
    on Linux; with 41 both refuse (``ELOOP``)."""
    for count, ok in ((MAX_LINKS, True), (MAX_LINKS + 1, False)):
        tree: dict[str, tuple[EntryType, str]] = {"end": (F, "")}
        for i in range(count):
            tree[f"l{i}"] = (L, f"l{i + 1}" if i + 1 < count else "end")
        assert (escape("l0", tree["l0"][1], _lookup(tree)) is None) is ok, count


def _chain_tree(src: Path) -> Path:
    """The probe's tree: ``q -> .`` and ``shadow-link`` through it to /etc/shadow."""
    src.mkdir()
    (src / "a.txt").write_bytes(b"a")
    (src / "q").symlink_to(".")
    (src / "shadow-link").symlink_to(CHAIN)
    return src


def test_the_probes_chain_is_refused_at_publish_and_nothing_is_committed(tmp_path: Path) -> None:
    src = _chain_tree(tmp_path / "src")
    assert os.path.realpath(src / "shadow-link") == "/etc/shadow"  # what a mount would give
    data = tmp_path / "data"
    with pytest.raises(SourceError) as caught:
        publish(data, "a", src)
    message = str(caught.value)
    assert message.startswith(f"cannot publish symlink 'shadow-link': its target {CHAIN!r} ")
    assert "climbs above the snapshot's root" in message and "\n" not in message
    assert "--allow-external-symlinks" in message
    with Catalog(data / "catalog") as catalog:
        assert catalog.list_datasets() == []
        assert catalog.list_publishes() == []  # the staged manifest is gone too


def test_the_cli_refuses_the_chain_in_one_line_and_publishes_it_when_allowed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _chain_tree(tmp_path / "src")
    data = str(tmp_path / "data")
    assert main(["publish", "--data-dir", data, "a", str(src)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("strata-hub: error: cannot publish symlink 'shadow-link'")
    assert main(["publish", "--data-dir", data, "a", str(src), "--allow-external-symlinks"]) == 0
    assert capsys.readouterr().out == "v1\n"


def test_loops_are_refused(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").symlink_to("b")
    (src / "b").symlink_to("a")
    with pytest.raises(SourceError, match=f"'a'.* does not resolve within {MAX_LINKS} symlinks"):
        publish(tmp_path / "data", "a", src)


def test_relative_and_dangling_links_inside_the_tree_still_publish(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "data").mkdir(parents=True)
    (src / "sub").mkdir()
    (src / "data" / "big.bin").write_bytes(b"big")
    (src / "q").symlink_to(".")
    (src / "sub" / "up").symlink_to("..")
    links = {
        "sub/file": "../data/big.bin",
        "sub/dir": "../data",
        "via-links": "q/q/sub/up/data/big.bin",
        "dangling": "data/../missing/nowhere",
        "dangling-deeper": "q/missing/../../etc/shadow",
    }
    for link, target in links.items():
        (src / link).symlink_to(target)
    data = tmp_path / "data-dir"
    publish(data, "a", src)
    with Catalog(data / "catalog") as catalog:
        snapshot = catalog.resolve("a", "latest")
        shown = {
            e.path: e.symlink_target
            for e in catalog.iter_manifest(snapshot.snapshot_id)
            if e.type == EntryType.SYMLINK
        }
    assert shown == {**links, "q": ".", "sub/up": ".."}


def test_many_symlinks_are_resolved_through_the_staged_manifest(tmp_path: Path) -> None:
    """Three pages of staged entries, every other one a link through another: all are
    looked at (one past the first page climbs out and is refused)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "q").symlink_to(".")
    for i in range(1500):
        (src / f"f{i:04d}").write_bytes(b"")
        (src / f"l{i:04d}").symlink_to(f"q/f{i:04d}")
    (src / "l1499").unlink()
    (src / "l1499").symlink_to("q/../f1499")
    with pytest.raises(SourceError, match="'l1499'"):
        publish(tmp_path / "data", "a", src)
