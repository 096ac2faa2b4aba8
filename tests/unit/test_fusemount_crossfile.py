"""Cross-file readahead in the mount: one reader's in-order walk over a snapshot's files
gets the next files asked for with a doubling window; random opens, shuffled epochs and
neighbours opened by different readers get nothing."""

from __future__ import annotations

import random
from pathlib import Path

from fusemount.crossfile import CrossFileReadahead
from fusemount.reader import BlockReader
from fusemount.tree import DIR_MODE, InodeTable, Node, Role
from protocol.hub.v1 import hub_pb2
from spoke.disk.layout import CacheLayout
from tests.component.fake_daemon import FakeDaemon

SIZE = 1 << 20


def _digest(i: int, k: int = 0) -> str:
    return f"{i:016x}{k:016x}"


def _files(count: int, blocks_per_file: int = 1, snapshot: str = "s1") -> list[Node]:
    """A snapshot's files as the mount loads them (manifest order, positions)."""
    entries = [hub_pb2.ManifestEntry(path="c", type=hub_pb2.ENTRY_TYPE_DIRECTORY)]
    entries.append(hub_pb2.ManifestEntry(path="c/empty", type=hub_pb2.ENTRY_TYPE_FILE))
    for i in range(count):
        entries.append(
            hub_pb2.ManifestEntry(
                path=f"c/{i:04d}",
                type=hub_pb2.ENTRY_TYPE_FILE,
                size=SIZE * blocks_per_file,
                blocks=[
                    hub_pb2.BlockRef(digest=_digest(i, k), size=SIZE)
                    for k in range(blocks_per_file)
                ],
            )
        )
    table = InodeTable()
    root = table.intern(("version", snapshot), Node(0, Role.VERSION, DIR_MODE))
    table.load_snapshot(root, snapshot, entries)
    return table.files(snapshot)


def _walk(
    ra: CrossFileReadahead, files: list[Node], opens: list[tuple[int, int]]
) -> list[list[int]]:
    """Each ``(reader, position)`` opened in turn; the windows asked for, as file numbers."""
    out = []
    for reader, pos in opens:
        blocks = ra.on_open(reader, files[pos], files)
        if blocks:
            out.append(sorted({int(d[:16], 16) for d, _ in blocks}))
    return out


def test_files_with_data_are_numbered_in_manifest_order() -> None:
    files = _files(5)
    assert [f.position for f in files] == [0, 1, 2, 3, 4]
    assert [f.blocks[0][0] for f in files] == [_digest(i) for i in range(5)]  # no empty file


def test_an_in_order_walk_gets_a_doubling_window_ahead() -> None:
    files = _files(100)
    ra = CrossFileReadahead(max_bytes=8 * SIZE)
    assert _walk(ra, files, [(1, i) for i in range(12)]) == [
        [3, 4],  # after 3 in-order opens: the next 2 files
        [5, 6, 7, 8],  # opening 3 (the marker): twice the window, after the last
        [9, 10, 11, 12, 13, 14, 15, 16],  # opening 5
        [17, 18, 19, 20, 21, 22, 23, 24],  # opening 9: at max_bytes
    ]
    assert ra.windows == 4 and ra.blocks == 22


def test_shuffled_epochs_and_random_opens_prefetch_nothing() -> None:
    files = _files(192)
    ra = CrossFileReadahead()
    rng = random.Random(0)
    opens = []
    for _ in range(4):  # 4 epochs, 4 readers, each its share of a shuffled order
        order = list(range(192))
        rng.shuffle(order)
        opens += [(r % 4, pos) for r, pos in enumerate(order)]
    assert _walk(ra, files, opens) == []
    # chance neighbours of one reader, as a shuffle gives them: never three in a row
    assert _walk(ra, files, [(9, p) for p in [40, 41, 7, 63, 64, 12, 90, 91, 3, 55]]) == []
    assert ra.windows == 0


def test_one_walk_split_between_readers_is_no_run() -> None:
    """Runs are confirmed only by one reader's consecutive opens: two readers taking
    every other file each jump by two."""
    files = _files(50)
    ra = CrossFileReadahead()
    assert _walk(ra, files, [(i % 2, i) for i in range(20)]) == []


def test_interleaved_readers_each_get_their_own_run() -> None:
    files = _files(200)
    ra = CrossFileReadahead(max_bytes=4 * SIZE)
    opens = [pair for step in range(6) for pair in ((1, step), (2, 100 + step))]
    assert _walk(ra, files, opens)[:2] == [[3, 4], [103, 104]]
    assert ra.readers == 2


def test_a_jump_ends_the_run_and_reopening_a_file_does_not() -> None:
    files = _files(100)
    ra = CrossFileReadahead()
    assert _walk(ra, files, [(1, 0), (1, 1), (1, 1), (1, 2)]) == [[3, 4]]
    assert _walk(ra, files, [(1, 3)]) == [[5, 6, 7, 8]]  # the marker
    assert _walk(ra, files, [(1, 60), (1, 4), (1, 5)]) == []  # 60: a new start
    assert _walk(ra, files, [(1, 6)]) == [[7, 8]]  # 4, 5, 6: three in a row again


def test_only_the_head_of_each_big_file_is_asked_for() -> None:
    files = _files(10, blocks_per_file=5)
    ra = CrossFileReadahead(head_blocks=2)
    for i in range(2):
        assert ra.on_open(1, files[i], files) == []
    assert ra.on_open(1, files[2], files) == [*files[3].blocks[:2], *files[4].blocks[:2]]


def test_the_walk_stops_at_the_last_file() -> None:
    files = _files(5)
    ra = CrossFileReadahead()
    got = _walk(ra, files, [(1, i) for i in range(5)])
    assert sorted(f for w in got for f in w) == [3, 4]


def test_another_snapshot_starts_afresh() -> None:
    a, b = _files(20, snapshot="a"), _files(20, snapshot="b")
    ra = CrossFileReadahead()
    ra.on_open(1, a[0], a)
    ra.on_open(1, a[1], a)
    assert ra.on_open(1, b[2], b) == []  # position 2, but of another snapshot
    assert ra.windows == 0


def test_nothing_is_asked_for_while_a_hint_is_installed(tmp_path: Path) -> None:
    daemon = FakeDaemon(CacheLayout(tmp_path), {})
    reader = BlockReader(daemon.layout, daemon)  # type: ignore[arg-type]
    files = _files(20)
    daemon.prompt = True  # the daemon's answers say a read-order hint is installed
    for i in range(6):
        reader.opened(files[i], 7, files)
    assert reader.crossfile.windows == 0
    daemon.prompt = False
    for i in range(6, 9):
        reader.opened(files[i], 7, files)
    assert reader.crossfile.windows == 1


def test_files_past_the_daemons_room_stay_ahead_for_the_next_window() -> None:
    files = _files(100)
    ra = CrossFileReadahead(max_bytes=8 * SIZE)
    assert _walk(ra, files, [(1, i) for i in range(5)]) == [[3, 4], [5, 6, 7, 8]]
    assert [int(d[:16], 16) for d, _ in ra.on_open(1, files[5], files, room=2 * SIZE)] == [
        9,
        10,
    ]  # the window is 8 files; the daemon takes 2 now
    # the marker of the cut window asks for what was left out, right after it
    got = ra.on_open(1, files[6], files) + ra.on_open(1, files[7], files)
    got += ra.on_open(1, files[8], files) + ra.on_open(1, files[9], files)
    assert [int(d[:16], 16) for d, _ in got] == list(range(11, 19))
