"""``user.strata.cached_bytes`` (fusemount/residency.py): the count is right, a file's is
kept for a second, distinct blocks are statted once, and counts run one at a time on a
thread of their own (issue 39's seventeenth probe: 48 loops of one user asking kept the
mount's threads busy and everyone's opens took 40-60 times longer)."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest
import trio

from fusemount import residency
from fusemount.residency import CachedBytes
from fusemount.tree import Node, Role


def _file(inode: int, blocks: tuple[tuple[str, int], ...]) -> Node:
    return Node(inode, Role.ENTRY, stat.S_IFREG | 0o644, blocks=blocks)


def _cache(root: Path, *digests: str) -> None:
    for digest in digests:
        (root / digest[:2]).mkdir(exist_ok=True)
        (root / digest[:2] / digest).write_bytes(b"x")


def test_counts_the_bytes_of_cached_blocks_once_a_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here, gone = "ab" * 16, "cd" * 16
    _cache(tmp_path, here)
    now = [100.0]
    counter = CachedBytes(str(tmp_path), clock=lambda: now[0])
    stats: list[str] = []
    real = os.path.exists

    def exists(path: str) -> bool:
        stats.append(path)
        return real(path)

    monkeypatch.setattr(os.path, "exists", exists)
    node = _file(7, ((here, 10), (gone, 20), (here, 10), (here, 5)))

    async def go() -> list[int]:
        answers = [await counter.of(node)]
        _cache(tmp_path, gone)
        answers.append(await counter.of(node))  # within the second: the kept count
        now[0] += residency.FRESH_S + 0.01
        answers.append(await counter.of(node))
        return answers

    assert trio.run(go) == [25, 25, 45]
    assert counter.counts == 2
    assert len(stats) == 4  # two distinct blocks, twice


def test_callers_of_one_file_share_one_count_and_counts_run_one_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    running, most = [0], [0]
    real = CachedBytes._count

    def slow(self: CachedBytes, blocks: tuple[tuple[str, int], ...]) -> int:
        running[0] += 1
        most[0] = max(most[0], running[0])
        try:
            time.sleep(0.02)
            return real(self, blocks)
        finally:
            running[0] -= 1

    monkeypatch.setattr(CachedBytes, "_count", slow)
    counter = CachedBytes(str(tmp_path))
    files = [_file(10 + i, (("ef" * 16, 1),)) for i in range(4)]

    async def go() -> None:
        async with trio.open_nursery() as nursery:
            for node in files:
                for _ in range(5):  # five callers a file
                    nursery.start_soon(counter.of, node)

    trio.run(go)
    assert counter.counts == 4  # one a file
    assert most[0] == 1
