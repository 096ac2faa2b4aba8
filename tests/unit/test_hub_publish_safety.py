"""Publishing a tree that someone else can write while it is read: a directory swapped
for a symlink never makes the publish read outside the tree, and symlinks that point
outside the snapshot are refused unless allowed."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from hub.catalog import Catalog
from hub.cli.main import main
from hub.errors import SourceError
from hub.publish.tree import publish
from hub.publish.walk import leaves_tree, open_file, walk
from hub.snapshot.blocks import block_digest
from hub.snapshot.manifest import EntryType
from hub.store.blobstore import LocalBlobStore

SECRET = b"the outside file: never in the blob store " * 8
DECOY = b"the file that belongs to the tree " * 8
TRIES = 300


def _versions(data: Path, dataset: str) -> list[list[tuple[str, str, tuple[str, ...]]]]:
    """Every live version's manifest as (path, symlink target, block digests)."""
    out = []
    with Catalog(data / "catalog") as catalog:
        for snapshot in catalog.list_versions(dataset):
            out.append(
                [
                    (e.path, e.symlink_target, tuple(b.digest for b in e.blocks))
                    for e in catalog.iter_manifest(snapshot.snapshot_id)
                ]
            )
    return out


@pytest.mark.parametrize("allow_external", [False, True], ids=["default", "allow-external"])
def test_a_directory_swapped_for_a_symlink_never_ships_the_outside_file(
    tmp_path: Path, allow_external: bool
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.bin").write_bytes(SECRET)
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "secret.bin").write_bytes(DECOY)  # the same name inside the tree
    for i in range(20):  # members before and after d widen the window between steps
        (src / f"a{i:02d}").write_bytes(b"%d" % i)
        (src / f"e{i:02d}").write_bytes(b"%d" % i)
    data = tmp_path / "data"
    stop = threading.Event()
    swaps = 0

    def swapper() -> None:
        nonlocal swaps
        d, real, link = src / "d", src / "d-real", src / "d-link"
        while not stop.is_set():
            link.symlink_to(outside)  # an absolute link to a directory holding "secret.bin"
            os.rename(d, real)
            os.rename(link, d)  # d is now the symlink
            for _ in range(50):  # and stays one long enough for a walk that follows it to
                os.lstat(d)  # list the outside directory and open its file (the old walk did)
            os.rename(d, link)
            os.rename(real, d)  # d is the directory again
            link.unlink()
            swaps += 1

    thread = threading.Thread(target=swapper, daemon=True)
    published = refused = 0
    thread.start()
    try:
        for _ in range(TRIES):
            try:
                publish(data, "race", src, block_size=4096, allow_external_symlinks=allow_external)
                published += 1
            except SourceError as exc:  # replaced mid-walk, or (default) an external link
                assert "replaced while publishing" in str(exc) or "outside" in str(exc), exc
                refused += 1
    finally:
        stop.set()
        thread.join()
    assert published + refused == TRIES and swaps > 0
    secret = block_digest(SECRET)
    assert not LocalBlobStore(data / "blobs").exists(secret)
    versions = _versions(data, "race")
    assert len(versions) == published
    for entries in versions:
        for path, target, digests in entries:
            assert secret not in digests, path
            if target and not allow_external:
                assert not leaves_tree(path, target), (path, target)
    print(f"{published} published, {refused} refused, {swaps} swaps")


def test_walk_refuses_a_directory_replaced_after_it_was_listed(tmp_path: Path) -> None:
    (tmp_path / "src" / "d").mkdir(parents=True)
    (tmp_path / "src" / "d" / "f").write_bytes(b"inside")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "f").write_bytes(b"outside")
    members = walk(tmp_path / "src")
    assert next(members).path == "d"  # listed as a directory, not yet entered
    os.rename(tmp_path / "src" / "d", tmp_path / "d-moved")
    (tmp_path / "src" / "d").symlink_to(tmp_path / "outside")
    with pytest.raises(SourceError, match="'d': it was replaced while publishing"):
        next(members)


def test_walk_refuses_a_directory_replaced_by_another_directory(tmp_path: Path) -> None:
    (tmp_path / "src" / "d").mkdir(parents=True)
    (tmp_path / "other").mkdir()
    members = walk(tmp_path / "src")
    assert next(members).path == "d"
    os.rename(tmp_path / "src" / "d", tmp_path / "d-moved")
    os.rename(tmp_path / "other", tmp_path / "src" / "d")
    with pytest.raises(SourceError, match="'d': it was replaced while publishing"):
        next(members)


def test_a_file_replaced_by_a_symlink_is_refused(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f").write_bytes(b"inside")
    (tmp_path / "secret").write_bytes(SECRET)
    members = walk(tmp_path / "src")
    member = next(members)
    (tmp_path / "src" / "f").unlink()
    (tmp_path / "src" / "f").symlink_to(tmp_path / "secret")
    with pytest.raises(SourceError, match="'f': it was replaced while publishing"):
        open_file(member)
    members.close()


def test_the_walk_reads_through_a_moved_directory_not_its_old_name(tmp_path: Path) -> None:
    """Once entered, a directory is read through its descriptor: renaming it away and
    putting a symlink in its place changes nothing about what the walk lists."""
    (tmp_path / "src" / "d").mkdir(parents=True)
    (tmp_path / "src" / "d" / "inside").write_bytes(b"")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_bytes(SECRET)
    members = walk(tmp_path / "src")
    assert next(members).path == "d"
    assert next(members).path == "d/inside"  # d is open and listed now
    os.rename(tmp_path / "src" / "d", tmp_path / "d-moved")
    (tmp_path / "src" / "d").symlink_to(tmp_path / "outside")
    assert list(members) == []


@pytest.mark.parametrize(
    ("link", "target", "outside"),
    [
        ("l", "/etc/shadow", True),
        ("l", "..", True),
        ("l", "../src/x", True),  # climbs out, even if it would land back inside
        ("sub/l", "../../x", True),
        ("sub/l", "a/../../../x", True),
        ("l", "sub/x", False),
        ("sub/l", "../x", False),
        ("sub/l", "./../sub/./x", False),
        ("l", "missing/../x", False),
        ("l", ".", False),
    ],
)
def test_leaves_tree(link: str, target: str, outside: bool) -> None:
    assert leaves_tree(link, target) is outside


@pytest.fixture
def external(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "ok").symlink_to("../a.txt")
    (src / "a.txt").write_bytes(b"a")
    (src / "sub" / "shadow").symlink_to("/etc/shadow")
    return src


def test_a_symlink_leaving_the_tree_is_refused(tmp_path: Path, external: Path) -> None:
    data = tmp_path / "data"
    with pytest.raises(SourceError) as caught:
        publish(data, "f3", external)
    message = str(caught.value)
    assert "'sub/shadow'" in message and "'/etc/shadow'" in message and "\n" not in message
    assert "--allow-external-symlinks" in message
    with Catalog(data / "catalog") as catalog:
        assert catalog.list_datasets() == []


def test_a_symlink_leaving_the_tree_is_published_when_allowed(
    tmp_path: Path, external: Path
) -> None:
    data = tmp_path / "data"
    publish(data, "f3", external, allow_external_symlinks=True)
    (entries,) = _versions(data, "f3")
    assert ("sub/shadow", "/etc/shadow", ()) in entries
    assert ("sub/ok", "../a.txt", ()) in entries
    with Catalog(data / "catalog") as catalog:
        snapshot = catalog.resolve("f3", "latest")
        kinds = {e.path: e.type for e in catalog.iter_manifest(snapshot.snapshot_id)}
    assert kinds["sub/shadow"] == EntryType.SYMLINK


def test_the_cli_refuses_external_symlinks_in_one_line_and_allows_them_with_the_flag(
    tmp_path: Path, external: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = str(tmp_path / "data")
    assert main(["publish", "--data-dir", data, "f3", str(external)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith("strata-hub: error: ") and "'sub/shadow'" in line
    flag = "--allow-external-symlinks"
    assert main(["publish", "--data-dir", data, "f3", str(external), flag]) == 0
    assert capsys.readouterr().out == "v1\n"
