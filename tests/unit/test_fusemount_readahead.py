"""Readahead windows: start after two consecutive reads, grow while sequential, reset on
a seek, stop at the end."""

from __future__ import annotations

from fusemount.readahead import Readahead


def test_sequential_reads_grow_the_window_up_to_the_maximum() -> None:
    ra = Readahead(initial=2, maximum=8)
    assert list(ra.on_read(0, 0, 100)) == []  # a first read is no run yet
    issued: list[int] = []
    for block in range(1, 40):
        issued += list(ra.on_read(block, block, 100))
    assert issued == list(range(2, max(issued) + 1))  # every block once, in order
    assert ra.window == 8
    assert max(issued) - 39 <= 2 * 8  # never more than two windows ahead


def test_a_seek_resets_the_window_and_random_reads_prefetch_nothing() -> None:
    ra = Readahead(initial=2, maximum=16)
    for block in range(10):
        ra.on_read(block, block, 100)
    assert ra.window > 2
    assert list(ra.on_read(50, 50, 100)) == []  # a seek
    assert ra.window == 0
    assert list(ra.on_read(51, 51, 100)) == [52, 53]  # sequential again: small window
    assert list(ra.on_read(7, 7, 100)) == []
    assert list(ra.on_read(70, 70, 100)) == []


def test_no_prefetch_past_the_last_block_or_for_one_block_files() -> None:
    ra = Readahead(initial=4, maximum=4)
    assert list(ra.on_read(0, 0, 3)) == []
    assert list(ra.on_read(0, 0, 3)) == [1, 2]  # nothing past block 2
    assert list(ra.on_read(1, 2, 3)) == []
    one = Readahead()
    assert list(one.on_read(0, 0, 1)) == [] and list(one.on_read(0, 0, 1)) == []


def test_repeated_reads_of_one_block_issue_nothing_new() -> None:
    ra = Readahead(initial=2, maximum=8)
    assert list(ra.on_read(0, 0, 100)) == []
    assert list(ra.on_read(0, 0, 100)) == [1, 2]  # the second read in order starts the run
    assert list(ra.on_read(0, 0, 100)) == []


def test_byte_ranges_in_order_grow_the_window_and_random_ones_never_do() -> None:
    bs = 4 << 20
    ra = Readahead(initial=2, maximum=8)
    assert list(ra.on_range(0, 128 << 10, bs, 100)) == []  # confirmed by the next read
    issued: list[int] = []
    for i in range(1, 200):  # 128 KiB reads, in order, as the kernel sends them
        issued += list(ra.on_range(i * (128 << 10), (i + 1) * (128 << 10), bs, 100))
    assert issued == list(range(1, max(issued) + 1))
    assert ra.window == 8
    ra = Readahead()
    # random 4 KiB reads, several of them in the block the previous one read
    offsets = [5 * bs + 8192, 5 * bs + 4096, 5 * bs + 3 * (1 << 20), 6 * bs + (2 << 20), 7 * bs]
    for offset in offsets:
        assert list(ra.on_range(offset, offset + 4096, bs, 100)) == []
    assert ra.window == 0
    # a small gap (pages the kernel already holds) still counts as in order
    assert list(ra.on_range(7 * bs + 4096 + 65536, 7 * bs + 200_000, bs, 100)) == [8, 9]


def test_a_window_is_cut_to_the_daemons_room_and_the_rest_follows() -> None:
    ra = Readahead(initial=4, maximum=8)
    assert list(ra.on_read(0, 0, 100)) == []
    assert list(ra.on_read(0, 0, 100, room=1)) == [1]  # the daemon takes one block now
    assert list(ra.on_read(1, 1, 100, room=0)) == []  # none: nothing asked, nothing skipped
    assert list(ra.on_read(2, 2, 100)) == list(range(3, 11))  # on, past the reader (at 2)
