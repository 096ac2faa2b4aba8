"""Prewarm batching: batches bounded by blocks and bytes, in order, nothing lost."""

from __future__ import annotations

from spoke.prefetch.prewarm import fetch_batches


def test_batches_keep_order_and_respect_both_bounds() -> None:
    blocks = [(f"{i:032x}", size) for i, size in enumerate([10, 10, 30, 5, 5, 5, 5, 100, 1])]
    batches = fetch_batches(blocks, most_blocks=3, most_bytes=40)
    assert [b for batch in batches for b in batch] == blocks
    assert [len(b) for b in batches] == [2, 3, 2, 1, 1]
    assert all(sum(s for _, s in b) <= 40 or len(b) == 1 for b in batches)  # 100 alone


def test_small_blocks_fill_batches_large_ones_go_alone() -> None:
    small = [(f"{i:032x}", 64 << 10) for i in range(40)]
    assert [len(b) for b in fetch_batches(small)] == [16, 16, 8]
    large = [(f"{i:032x}", 64 << 20) for i in range(3)]
    assert [len(b) for b in fetch_batches(large)] == [1, 1, 1]
    assert fetch_batches([]) == []
