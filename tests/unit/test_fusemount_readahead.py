"""Readahead windows: grow while sequential, reset on a seek, stop at the end."""

from __future__ import annotations

from fusemount.readahead import Readahead


def test_sequential_reads_grow_the_window_up_to_the_maximum() -> None:
    ra = Readahead(initial=2, maximum=8)
    assert list(ra.on_read(0, 0, 100)) == [1, 2]
    issued = [1, 2]
    for block in range(1, 40):
        issued += list(ra.on_read(block, block, 100))
    assert issued == list(range(1, max(issued) + 1))  # every block once, in order
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
    assert list(ra.on_read(0, 0, 3)) == [1, 2]
    assert list(ra.on_read(1, 2, 3)) == []  # nothing past block 2
    assert list(Readahead().on_read(0, 0, 1)) == []


def test_repeated_reads_of_one_block_issue_nothing_new() -> None:
    ra = Readahead(initial=2, maximum=8)
    assert list(ra.on_read(0, 0, 100)) == [1, 2]
    assert list(ra.on_read(0, 0, 100)) == []
