"""The mount's snapshot columns (fusemount.entries) against a plain model of the tree the
dict-based table built: every lookup, listing, count and attribute exact."""

from __future__ import annotations

import random
import stat

import pytest

from fusemount.entries import SnapshotEntries
from fusemount.tree import DIR_MODE, InodeTable, Node, Role
from protocol.hub.v1 import hub_pb2

FILE, DIR, LINK = hub_pb2.ENTRY_TYPE_FILE, hub_pb2.ENTRY_TYPE_DIRECTORY, hub_pb2.ENTRY_TYPE_SYMLINK


def _model(entries: list[hub_pb2.ManifestEntry]) -> dict[str, object]:
    """What the tree holds, by the rules the dict-based table followed: numbered in
    order, implicit parents first, a path already a directory skipped, a repeated name
    listing the later entry."""
    numbered: list[tuple[str, hub_pb2.ManifestEntry]] = []
    dirs: dict[str, int] = {"": 0}
    listing: dict[int, dict[bytes, int]] = {0: {}}

    def add(e: hub_pb2.ManifestEntry) -> None:
        head, _, name = e.path.rpartition("/")
        if head not in dirs:
            add(hub_pb2.ManifestEntry(path=head, type=DIR, mode=0o555))
        numbered.append((e.path, e))
        i = len(numbered)
        listing[dirs[head]][name.encode()] = i
        if e.type == DIR:
            dirs[e.path] = i
            listing[i] = {}

    for e in entries:
        if e.path not in dirs:
            add(e)
    return {"numbered": numbered, "listing": listing}


def _manifest(rng: random.Random, count: int) -> list[hub_pb2.ManifestEntry]:
    names = ["a", "a-b", "a.c", "b", "a0", "é", "z z"]
    paths: set[str] = set()
    while len(paths) < count:
        depth = rng.randint(1, 3)
        paths.add("/".join(rng.choice(names) for _ in range(depth)))
    out = []
    for path in sorted(paths):
        kind = rng.choice([FILE, FILE, FILE, DIR, LINK])
        blocks = [
            hub_pb2.BlockRef(digest=rng.randbytes(16).hex(), size=rng.randint(1, 1 << 22))
            for _ in range(rng.randint(0, 3) if kind == FILE else 0)
        ]
        out.append(
            hub_pb2.ManifestEntry(
                path=path, type=kind, mode=rng.choice([0o644, 0o755, 0o600]),
                size=rng.randint(0, 1 << 40), mtime_ns=rng.randint(-(1 << 40), 1 << 62),
                symlink_target="t/" + path if kind == LINK else "", blocks=blocks,
            )
        )  # fmt: skip
    return out


@pytest.mark.parametrize("seed", range(6))
def test_columns_hold_every_entry_of_the_model(seed: int) -> None:
    rng = random.Random(seed)
    entries = _manifest(rng, 60)
    if seed % 2:  # a name given twice in one directory: the later one is listed
        entries.append(hub_pb2.ManifestEntry(path=entries[-1].path, type=FILE, size=3))
    model = _model(entries)
    built = SnapshotEntries.build(iter(entries))
    numbered = model["numbered"]
    listing = model["listing"]
    assert isinstance(numbered, list) and isinstance(listing, dict)
    assert built.count == len(numbered)
    files = 0
    for i, (path, e) in enumerate(numbered, start=1):
        mode = {FILE: stat.S_IFREG, DIR: stat.S_IFDIR, LINK: stat.S_IFLNK}[e.type]
        assert built.modes[i] == mode | (e.mode & 0o7777)
        assert (built.sizes[i], built.mtimes[i]) == (e.size, e.mtime_ns)
        assert built.name(i) == path.rpartition("/")[2].encode()
        assert built.blocks(i) == tuple((b.digest, b.size) for b in e.blocks)
        assert built.target(i) == e.symlink_target.encode()
        if e.type == FILE and e.blocks:
            assert built.positions[i] == files and built.files[files] == i
            files += 1
        else:
            assert built.positions[i] == -1
    assert len(built.files) == files
    for d, kids in listing.items():
        view = built.listing(d, 1000)
        assert list(view.names) == sorted(kids) and len(view) == len(kids)
        assert dict(view.items()) == {n: 999 + k for n, k in kids.items()}
        assert list(view.inodes()) == [999 + kids[n] for n in sorted(kids)]
        assert view.get(b"no such name") is None and b"no such name" not in view
        if d:
            subdirs = sum(numbered[k - 1][1].type == DIR for k in kids.values())
            assert built.nlinks[d] == 2 + subdirs


def test_odd_digests_are_kept_as_given() -> None:
    digests = {"a": "AB" * 16, "b": "ab" * 32, "c": "ab" * 16}
    entries = [
        hub_pb2.ManifestEntry(
            path=path, type=FILE, size=4, blocks=[hub_pb2.BlockRef(digest=digest, size=4)]
        )
        for path, digest in digests.items()
    ]
    built = SnapshotEntries.build(entries)
    assert [built.blocks(i)[0][0] for i in (1, 2, 3)] == ["AB" * 16, "ab" * 32, "ab" * 16]
    assert len(built.digests) == 16  # only the canonical one in the columns


def test_the_table_makes_entry_nodes_and_counts_kernel_references() -> None:
    table = InodeTable()
    root = table.intern(
        ("version", "d", "v1"),
        Node(0, Role.VERSION, DIR_MODE, dataset="d", version="v1", snapshot_id="s"),
    )
    entries = [
        hub_pb2.ManifestEntry(
            path=f"x{i // 10}/f{i}", type=FILE, size=5, mode=0o644,
            blocks=[hub_pb2.BlockRef(digest=f"{i:032x}", size=5)],
        )
        for i in range(30)
    ]  # fmt: skip
    table.load_snapshot(root, "s", entries)
    inodes = table.entry_inodes("s")
    assert len(inodes) == 33 and len(table) == 2 + 33  # root, version, 3 dirs + 30 files
    assert root.children is not None and list(root.child_names) == [b"x0", b"x1", b"x2"]
    x1 = table[root.children[b"x1"]]
    assert x1.role is Role.ENTRY and x1.is_dir and x1.nlink == 2 and x1.children is not None
    f15 = table[x1.children[b"f15"]]
    assert (f15.size, f15.blocks, f15.dataset, f15.version) == (5, ((f"{15:032x}", 5),), "d", "v1")
    files = table.files("s")
    assert len(files) == 30 and files[f15.position].inode == f15.inode
    assert table.get(max(inodes) + 1) is None
    assert table.kernel_refs == 0 and not table.referenced(f15.inode)
    table.remember(f15.inode)
    table.remember(f15.inode)
    table.remember(root.inode)
    assert table.kernel_refs == 2 and table.referenced(f15.inode)
    table.forget(f15.inode, 1)
    assert table.kernel_refs == 2
    table.forget(f15.inode, 5)
    assert table.kernel_refs == 1 and not table.referenced(f15.inode)
    # the same content as another version: the same entries, listed under it too
    other = table.intern(
        ("version", "d", "v2"),
        Node(0, Role.VERSION, DIR_MODE, dataset="d", version="v2", snapshot_id="s"),
    )
    table.load_snapshot(other, "s", entries)
    assert other.children is not None and other.children[b"x1"] == x1.inode
    assert len(table) == 3 + 33


def test_a_snapshot_the_kernel_holds_nothing_of_is_unloaded_and_reloads_as_the_same_inodes() -> (
    None
):
    """Issue 39's seventeenth probe: every snapshot walked stayed loaded for the life of
    the mount (about 125 bytes a file a version). One none of whose entries the kernel
    has held for a while is unloaded; its range stays, so it reloads as the same inodes."""
    now = [100.0]
    table = InodeTable(clock=lambda: now[0])
    root = table.intern(
        ("version", "d", "v1"),
        Node(0, Role.VERSION, DIR_MODE, dataset="d", version="v1", snapshot_id="s"),
    )
    entries = [
        hub_pb2.ManifestEntry(
            path=f"f{i}", type=FILE, size=5, mode=0o644,
            blocks=[hub_pb2.BlockRef(digest=f"{i:032x}", size=5)],
        )
        for i in range(10)
    ]  # fmt: skip
    table.load_snapshot(root, "s", entries)
    assert root.children is not None
    f3 = root.children[b"f3"]
    table.remember(f3)
    now[0] += 120
    assert table.unload_idle(60) == 0  # the kernel holds f3
    table.forget(f3, 1)
    now[0] += 30
    assert table.unload_idle(60) == 0  # not idle long enough
    now[0] += 31
    assert table.unload_idle(60) == 1
    assert root.children is None and table.get(f3) is None and len(table) == 2
    assert table.pending_root(f3) is root  # asking for it loads its snapshot again
    table.load_snapshot(root, "s", entries)
    assert root.children is not None and root.children[b"f3"] == f3
    assert table[f3].blocks == ((f"{3:032x}", 5),)
    table.resumed = True  # after a hand-over the kernel's references are not known
    now[0] += 1000
    assert table.unload_idle(60) == 0
