"""Turns round a tree of networks (strata_local/prefixturns.py): an address's networks,
widest first, and round robin at every level, the newest key first (issue 39's older
MEDIUM: a flood from one host's /64 was as many callers as it had connections)."""

from __future__ import annotations

import pytest

from strata_local.prefixturns import AlternateTurns, PrefixTurns, network_path


def test_an_address_is_taken_in_its_networks_widest_first() -> None:
    assert network_path("10.1.2.3") == (b"\x0a\x01", b"\x0a\x01\x02", "10.1.2.3")
    v6 = bytes.fromhex("20010db800aa00bb")  # 2001:db8:aa:bb::/64
    assert network_path("2001:db8:aa:bb::7") == (v6[:4], v6[:6], v6, "2001:db8:aa:bb::7")
    link_local = bytes.fromhex("fe80000000000000")  # a scope is not part of the address
    assert network_path("fe80::1%eth0") == (*(link_local[:n] for n in (4, 6, 8)), "fe80::1%eth0")
    for alone in ("unix:/run/x", "10.1.2", "", "::g"):
        assert network_path(alone) == (alone,)


def test_each_level_takes_its_keys_in_turn_the_newest_first() -> None:
    turns = PrefixTurns[str]()
    for i in range(3):  # one /24 with three addresses, two items each
        turns.add(network_path(f"10.0.0.{i}"), f"a{i}")
        turns.add(network_path(f"10.0.0.{i}"), f"b{i}")
    turns.add(network_path("10.9.0.1"), "other")  # a second /16, the newest
    assert len(turns) == 7 and "a0" in turns
    taken = [turns.take() for _ in range(7)]
    # /16s in turn (the newest first); inside 10.0.0.0/24 the addresses in turn, the
    # newest first, each address's oldest item first
    assert taken == ["other", "a2", "a1", "a0", "b2", "b1", "b0"]
    assert len(turns) == 0
    with pytest.raises(LookupError):
        turns.take()


def test_a_removed_item_never_has_a_turn_and_a_turn_taken_elsewhere_moves_its_keys() -> None:
    turns = PrefixTurns[str]()
    for host, item in (("a", "a1"), ("a", "a2"), ("b", "b1"), ("c", "c1")):
        turns.add((host,), item)
    assert turns.remove("c1") and not turns.remove("c1") and not turns.remove("never")
    assert turns.remove("b1", turn=False) is True  # b's only item: b is gone
    turns.add(("b",), "b2")  # b joins again: the newest
    turns.add(("d",), "d1")
    assert turns.remove("d1", turn=True)
    turns.add(("d",), "d2")  # d is new again, first
    assert turns.remove("a1", turn=True)  # a had a turn elsewhere: behind b and d
    assert [turns.take() for _ in range(3)] == ["d2", "b2", "a2"]


def test_an_item_waits_once_under_a_path() -> None:
    turns = PrefixTurns[str]()
    turns.add(("a",), "x")
    with pytest.raises(ValueError, match="cannot add"):
        turns.add(("b",), "x")
    with pytest.raises(ValueError, match="cannot add"):
        turns.add((), "y")


def test_alternate_turns_take_from_each_tree_in_turn() -> None:
    turns = AlternateTurns[str]()
    for i, host in enumerate(("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.9.0.1")):
        turns.add(network_path(host), ("all",), f"c{i}")  # one queue, oldest first
    assert len(turns) == 4
    # round the networks: the newest /16 (c3); oldest first: c0; round the networks:
    # 10.0.0.0/16, its newest address not yet taken (c2); oldest first: c1
    assert [turns.take() for _ in range(4)] == ["c3", "c0", "c2", "c1"]
    turns.add(("x",), ("all",), "d")
    with pytest.raises(ValueError):
        turns.add(("y",), (), "e")  # the second path is empty: nothing added
    assert len(turns) == 1 and turns.remove("d") and not turns.remove("d") and len(turns) == 0
