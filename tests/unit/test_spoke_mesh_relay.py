"""The relay tree's arithmetic and the owner's memory of who asked (spoke/mesh/relay.py)."""

from __future__ import annotations

import pytest

from spoke.mesh.relay import RELAY_FANOUT, HotBlocks, levels, relay_of, relay_rank
from spoke.mesh.rendezvous import ranked, weight


def test_ranks_one_to_eight_hang_off_the_owner_and_each_rank_has_eight_children() -> None:
    assert RELAY_FANOUT == 8
    assert [relay_rank(r) for r in range(1, 9)] == [0] * 8
    assert [relay_rank(r) for r in (9, 16, 17, 72, 73)] == [1, 1, 2, 8, 9]
    children = {p: [r for r in range(1, 1024) if relay_rank(r) == p] for p in range(3)}
    assert children == {0: list(range(1, 9)), 1: list(range(9, 17)), 2: list(range(17, 25))}
    with pytest.raises(ValueError):
        relay_rank(0)


def test_levels_grow_as_log8_of_the_region() -> None:
    assert [levels(n) for n in (1, 2, 9, 10, 73, 74, 585, 586, 1024)] == [0, 1, 1, 2, 2, 3, 3, 4, 4]


def test_a_relay_always_scores_higher_than_its_asker_in_any_view() -> None:
    nodes = [f"10.0.{i // 250}.{i % 250}:7000" for i in range(300)]
    for key in ("a" * 32, "b" * 32, "0123456789abcdef" * 2):
        order = ranked(key, nodes)
        assert relay_of(key, nodes, order[0]) is None  # the owner asks the hub
        for rank in (1, 8, 9, 100, 299):
            parent = relay_of(key, nodes, order[rank])
            assert parent == order[(rank - 1) // 8]
            assert parent is not None and weight(parent, key) > weight(order[rank], key)
        # a view missing some spokes still sends each spoke up, never down: no loops
        view = nodes[::3]
        for me in view[:50]:
            parent = relay_of(key, view, me)
            assert parent is None or weight(parent, key) > weight(me, key)


def test_a_block_is_hot_after_eight_other_askers_within_the_window() -> None:
    clock = [0.0]
    hot = HotBlocks(window=10.0, tracked=2, now=lambda: clock[0])
    assert [hot.asked("d", f"n{i}") for i in range(8)] == [False] * 8
    assert hot.asked("d", "n8") and hot.asked("d", "n9")  # sent to their relay
    assert not hot.asked("d", "n3")  # one already served, asking again, is served
    clock[0] = 11.0  # the window passed: counted again from the first asker
    assert not hot.asked("d", "n9")
    hot.asked("e", "x")
    hot.asked("f", "x")
    assert len(hot) == 2  # the least recently asked forgotten first
