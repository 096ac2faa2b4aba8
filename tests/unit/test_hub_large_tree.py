"""A large tree streams through publish in path order, in bounded memory, and its
directories are listed through the index without reading the whole manifest."""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import pytest

from hub.catalog import Catalog
from hub.publish.tree import PublishResult, walk
from hub.snapshot.manifest import EntryType

DIRS = 20
FILES_PER_DIR = 1000
BLOCK_SIZE = 64 * 1024


def test_walk_is_in_path_order_where_dfs_is_not(tmp_path: Path) -> None:
    for name in ("a/x", "a/y/z", "a-b", "a.c", "a0", "b", "ab/c"):
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
    (tmp_path / "é").write_bytes(b"")  # non-ASCII sorts by UTF-8 bytes, after ASCII
    paths = [member.path for member in walk(tmp_path)]
    assert paths == sorted(paths)
    assert paths == ["a", "a-b", "a.c", "a/x", "a/y", "a/y/z", "a0", "ab", "ab/c", "b", "é"]


@dataclass(frozen=True)
class Published:
    data: Path
    result: PublishResult
    peak_bytes: int


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> Published:
    """20,000 small files in 20 directories, published once with memory tracing on."""
    base = tmp_path_factory.mktemp("big")
    root = base / "src"
    for d in range(DIRS):
        directory = root / f"shard-{d:02d}"
        directory.mkdir(parents=True)
        for f in range(FILES_PER_DIR):
            # 50 distinct contents: the test measures the tree, not 20,000 fsyncs.
            (directory / f"sample-{f:05d}.npy").write_bytes(f"label {f % 50}".encode())
    # A fresh interpreter: tracemalloc counts every thread, and threads left by other
    # tests (gRPC, trio's thread cache) would add their allocations to the peak.
    script = (
        "import json, sys, tracemalloc\n"
        "from dataclasses import asdict\n"
        "from hub.publish.tree import publish\n"
        "tracemalloc.start()\n"
        f"result = publish({str(base / 'data')!r}, 'big', {str(root)!r}, block_size={BLOCK_SIZE})\n"
        "peak = tracemalloc.get_traced_memory()[1]\n"
        "print(json.dumps({'result': asdict(result), 'peak': peak}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return Published(base / "data", PublishResult(**out["result"]), out["peak"])


def test_20000_files_publish_in_bounded_memory(published: Published) -> None:
    result = published.result
    assert (result.files, result.entries) == (DIRS * FILES_PER_DIR, DIRS * FILES_PER_DIR + DIRS)
    assert (result.new_blocks, result.new_bytes) == (50, sum(len(f"label {i}") for i in range(50)))
    with Catalog(published.data / "catalog") as catalog:
        snapshot = catalog.resolve("big", "latest")
        tracemalloc.start()
        try:
            tree = list(catalog.iter_manifest(snapshot.snapshot_id))
            tree_bytes = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
    assert len(tree) == result.entries
    # The streamed publish never holds the tree even once: one directory listing, one
    # batch of blocks and one block read buffer (BLOCK_SIZE) at a time.
    assert published.peak_bytes < tree_bytes, (published.peak_bytes, tree_bytes)
    with Catalog(published.data / "catalog") as catalog:
        snapshot = catalog.resolve("big", "latest")
        entries = list(catalog.iter_manifest(snapshot.snapshot_id))
        assert [e.path for e in entries] == sorted(e.path for e in entries)
        assert catalog.manifest_digest(snapshot.snapshot_id) == snapshot.snapshot_id


def test_directory_listing_reads_only_that_directory(published: Published) -> None:
    with Catalog(published.data / "catalog") as catalog:
        snapshot = catalog.resolve("big", "latest")
        root, more = catalog.list_directory(snapshot.snapshot_id, "", limit=5)
        assert [e.path for e in root] == [f"shard-{d:02d}" for d in range(5)] and more
        assert all(e.type == EntryType.DIRECTORY for e in root)
        page, more = catalog.list_directory(snapshot.snapshot_id, "shard-07", limit=3)
        assert [e.path for e in page] == [f"shard-07/sample-{f:05d}.npy" for f in range(3)]
        after = page[-1].path.rpartition("/")[2]
        page, _ = catalog.list_directory(snapshot.snapshot_id, "shard-07", after, limit=2)
        assert [e.path for e in page] == [f"shard-07/sample-{f:05d}.npy" for f in (3, 4)]
        last, more = catalog.list_directory(
            snapshot.snapshot_id, "shard-19", "sample-00998.npy", limit=10
        )
        assert [e.path for e in last] == ["shard-19/sample-00999.npy"] and not more
        # The index answers from a handful of pages, not by walking 20,000 entries.
        decoded: list[str] = []
        import hub.catalog.txn as catalog_module

        real = catalog_module.decode_entry

        def counting(value: bytes):  # type: ignore[no-untyped-def]
            entry = real(value)
            decoded.append(entry.path)
            return entry

        catalog_module.decode_entry = counting
        try:
            catalog.list_directory(snapshot.snapshot_id, "shard-11", limit=10)
        finally:
            catalog_module.decode_entry = real
        assert len(decoded) == 11, "the directory's own entry and its 10 children"
