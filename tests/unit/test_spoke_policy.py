"""LRU policy: recency order, byte accounting, exclusions."""

from __future__ import annotations

import pytest

from spoke.policy import LRUPolicy, make_policy


def test_lru_evicts_least_recently_used_first() -> None:
    p = LRUPolicy()
    for key, size in [("a", 10), ("b", 20), ("c", 30)]:
        p.insert(key, size)
        p.check_invariants()
    assert p.used_bytes == 60
    p.access("a")
    assert p.victim() == "b"
    assert p.remove("b") == 20
    p.check_invariants()
    assert p.victim() == "c"
    assert p.victim(exclude=["c"]) == "a"
    assert p.victim(exclude=["c", "a"]) is None
    assert p.used_bytes == 40 and len(p) == 2


def test_lru_reinsert_and_unknown_keys_are_harmless() -> None:
    p = LRUPolicy()
    p.insert("a", 5)
    p.insert("a", 5)
    p.access("zzz")
    assert p.remove("zzz") == 0
    p.check_invariants()
    assert p.used_bytes == 5 and p.keys_lru_first() == ["a"]


def test_negative_size_is_refused() -> None:
    with pytest.raises(ValueError):
        LRUPolicy().insert("a", -1)


def test_make_policy_names() -> None:
    assert isinstance(make_policy("lru"), LRUPolicy)
    with pytest.raises(ValueError, match="unknown cache policy"):
        make_policy("fifo")
