"""Cross-file readahead: in-order walks over a snapshot's files get the next files
prefetched with a doubling window; random reads and lone neighbours get nothing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from protocol.hub.v1 import hub_pb2
from spoke.crossfile import CrossFileReadahead
from spoke.scheduler import FetchScheduler, Priority
from spoke.snapshots import SnapshotIndex

SIZE = 1 << 20


class RecordingScheduler:
    """Takes prefetches and remembers them (nothing is cached, so all are 'new')."""

    def __init__(self) -> None:
        self.requests: list[list[str]] = []
        self.seen: set[str] = set()
        self.prefetch_room = 1 << 40

    def prefetch(self, blocks: Sequence[tuple[str, int]], priority: Priority) -> int:
        assert priority == Priority.READAHEAD
        new = [d for d, _ in blocks if d not in self.seen]
        self.seen |= set(new)
        self.requests.append([d for d, _ in blocks])
        return len(new)


def _digest(i: int, k: int = 0) -> str:
    return f"{i:016x}{k:016x}"


def _manifest(files: int, blocks_per_file: int = 1) -> list[hub_pb2.ManifestEntry]:
    entries = [hub_pb2.ManifestEntry(path="c", type=hub_pb2.ENTRY_TYPE_DIRECTORY)]
    for i in range(files):
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
    return entries


def _setup(
    files: int, blocks_per_file: int = 1, **kwargs: int
) -> tuple[CrossFileReadahead, RecordingScheduler]:
    index = SnapshotIndex()
    index.learn("d@v1", _manifest(files, blocks_per_file))
    scheduler = RecordingScheduler()
    return CrossFileReadahead(index, cast(FetchScheduler, scheduler), **kwargs), scheduler


def _files(requests: list[list[str]]) -> list[list[int]]:
    return [[int(d[:16], 16) for d in r] for r in requests]


def test_an_in_order_walk_gets_a_doubling_window_ahead() -> None:
    readahead, scheduler = _setup(100, max_bytes=8 * SIZE)
    for i in range(12):
        readahead.observe([_digest(i)], hit=i > 2)
    assert _files(scheduler.requests) == [
        [3, 4],  # after 3 in-order reads: the next 2 files
        [5, 6, 7, 8],  # reading 3 (the marker): twice the window, after the last
        [9, 10, 11, 12, 13, 14, 15, 16],  # reading 5
        [17, 18, 19, 20, 21, 22, 23, 24],  # reading 9: at max_bytes
    ]


def test_random_reads_and_neighbour_pairs_prefetch_nothing() -> None:
    readahead, scheduler = _setup(100)
    for i in [40, 7, 63, 64, 12, 90, 91, 3, 55]:
        readahead.observe([_digest(i)], hit=False)
    assert scheduler.requests == []


def test_interleaved_readers_each_get_their_own_run() -> None:
    readahead, scheduler = _setup(200, max_bytes=4 * SIZE)
    for step in range(6):
        readahead.observe([_digest(step)], hit=False)
        readahead.observe([_digest(100 + step)], hit=False)
    ahead = sorted(f for r in _files(scheduler.requests) for f in r)
    assert [f for f in ahead if f < 100] == list(range(3, 3 + len([f for f in ahead if f < 100])))
    assert [f for f in ahead if f >= 100][:2] == [103, 104]
    assert readahead.runs == 2


def test_only_the_head_of_each_big_file_is_fetched() -> None:
    readahead, scheduler = _setup(10, blocks_per_file=5, head_blocks=2)
    for i in range(3):
        for k in range(5):  # reading every block of a file is one read of that file
            readahead.observe([_digest(i, k)], hit=True)
    assert scheduler.requests[0] == [_digest(3, 0), _digest(3, 1), _digest(4, 0), _digest(4, 1)]


def test_the_walk_stops_at_the_last_file() -> None:
    readahead, scheduler = _setup(5)
    for i in range(5):
        readahead.observe([_digest(i)], hit=False)
    assert sorted(f for r in _files(scheduler.requests) for f in r) == [3, 4]


def test_reports_a_little_out_of_order_still_count() -> None:
    readahead, scheduler = _setup(100)
    for i in [0, 1, 2, 4, 3, 5, 6]:  # a batched hit report arriving after a later miss
        readahead.observe([_digest(i)], hit=False)
    assert _files(scheduler.requests)[0] == [3, 4]
    assert readahead.runs == 1


def test_neighbours_read_far_apart_are_no_walk() -> None:
    readahead, scheduler = _setup(100)
    for i in range(3):
        readahead.observe([_digest(i)], hit=False)
        for k in range(20):  # a random reader's other reads in between
            readahead.observe([_digest(50 + (k * 7 + i * 3) % 40)], hit=False)
    assert scheduler.requests == []


def test_nothing_is_prefetched_while_paused() -> None:
    paused = [True]
    index = SnapshotIndex()
    index.learn("d@v1", _manifest(20))
    scheduler = RecordingScheduler()
    readahead = CrossFileReadahead(index, cast(FetchScheduler, scheduler), paused=lambda: paused[0])
    for i in range(6):
        readahead.observe([_digest(i)], hit=False)
    assert scheduler.requests == []
    paused[0] = False
    for i in range(6, 9):
        readahead.observe([_digest(i)], hit=False)
    assert _files(scheduler.requests)[0] == [9, 10]


def test_files_past_the_prefetch_budget_stay_ahead_for_later() -> None:
    readahead, scheduler = _setup(100, max_bytes=8 * SIZE)
    for i in range(4):
        readahead.observe([_digest(i)], hit=False)
    assert _files(scheduler.requests) == [[3, 4], [5, 6, 7, 8]]
    scheduler.prefetch_room = 2 * SIZE  # the budget is nearly spent
    readahead.observe([_digest(5)], hit=True)
    assert _files(scheduler.requests)[-1] == [9, 10]
    scheduler.prefetch_room = 1 << 40
    readahead.observe([_digest(9)], hit=True)  # the marker of the trimmed window
    assert _files(scheduler.requests)[-1] == [11, 12, 13, 14, 15, 16, 17, 18]
