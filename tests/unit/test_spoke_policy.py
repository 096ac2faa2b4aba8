"""Eviction policies: one contract suite for every policy (LRU, ARC, SIEVE, S3-FIFO, and
HintedPolicy over each) and the behaviour of LRU and ARC of their own. State machines
against naive reference models of LRU and ARC: test_spoke_policy_reference.py; every
policy's invariants through random operations: test_spoke_policy_invariants.py; SIEVE's
and S3-FIFO's own behaviour and references: test_spoke_policy_fifo.py."""

from __future__ import annotations

import pytest

from spoke.cache.arc import ARCPolicy
from spoke.cache.hinted import HintedPolicy
from spoke.cache.lru import LRUPolicy
from spoke.cache.policy import EvictionPolicy
from spoke.cache.registry import POLICIES
from spoke.cache.registry import make_policy as _make_named
from tests.unit.policy_support import make_policy

ALL = [*sorted(POLICIES), "hinted"]  # hinted: HintedPolicy over ARC, no hint installed
WRAPPED = [f"hinted+{name}" for name in sorted(POLICIES)]  # HintedPolicy over each


def _fill(policy: EvictionPolicy, keys: list[str], size: int = 10) -> None:
    for k in keys:
        policy.insert(k, size)
        policy.check_invariants()


def _evict_to(policy: EvictionPolicy, capacity: int, protect: str | None = None) -> list[str]:
    out = []
    while policy.used_bytes > capacity:
        victim = policy.pop_victim(() if protect is None else (protect,))
        if victim is None:
            break
        out.append(victim[0])
        policy.check_invariants()
    return out


# -- contract: every policy ------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_insert_access_remove_account_bytes(name: str) -> None:
    p = make_policy(name, 100)
    _fill(p, ["a", "b", "c"])
    assert p.used_bytes == 30 and len(p) == 3 and "b" in p
    p.access("b")
    p.access("zzz")  # unknown: ignored
    assert p.remove("b") == 10 and "b" not in p
    assert p.remove("b") == 0
    p.check_invariants()
    assert p.used_bytes == 20 and len(p) == 2


@pytest.mark.parametrize("name", ALL)
def test_pop_victim_respects_exclude_and_empties(name: str) -> None:
    p = make_policy(name, 100)
    _fill(p, ["a", "b", "c"])
    victim = p.pop_victim(exclude=["a", "b"])
    assert victim == ("c", 10)
    assert p.pop_victim(exclude=["a", "b"]) is None
    seen = set()
    while (v := p.pop_victim()) is not None:
        seen.add(v[0])
        p.check_invariants()
    assert seen == {"a", "b"} and p.used_bytes == 0 and len(p) == 0


@pytest.mark.parametrize("name", ALL)
def test_reinsert_is_harmless_and_sizes_validated(name: str) -> None:
    p = make_policy(name, 100)
    p.insert("a", 5)
    p.insert("a", 5)
    p.check_invariants()
    assert p.used_bytes == 5
    with pytest.raises(ValueError):
        p.insert("b", -1)


@pytest.mark.parametrize("name", ["arc", "lru", "sieve", "hinted"])  # S3-FIFO: two hits
def test_recently_used_outlives_least_recently_used(name: str) -> None:
    p = make_policy(name, 30)
    _fill(p, ["a", "b", "c"])
    p.access("a")
    p.insert("d", 10)
    assert _evict_to(p, 30, protect="d") == ["b"]


@pytest.mark.parametrize("name", ALL + WRAPPED)
def test_a_prefetched_block_waits_at_the_cold_end_and_its_first_read_is_its_miss(
    name: str,
) -> None:
    """Unread prefetched blocks are every policy's first victims (they displace nothing
    it ranks); once read, a block sits where a miss at that moment would have put it."""
    p, twin = make_policy(name, 40), make_policy(name, 40)
    for q in (p, twin):
        _fill(q, ["a", "b", "c"])
        q.access("a")
    p.insert("x", 10, prefetched=True)
    p.insert("a", 10, prefetched=True)  # already resident: a prefetch is not a read
    p.check_invariants()
    assert p.resident()[0] == "x" and p.used_bytes == 40
    p.insert("y", 10, prefetched=True)
    assert _evict_to(p, 40, protect="y") == ["x"]  # the oldest unread goes first
    p.access("y")  # its first read: the miss the twin takes now
    twin.insert("y", 10)
    _evict_to(twin, 40, protect="y")
    assert p.resident() == twin.resident() and p.used_bytes == twin.used_bytes
    p.check_invariants()


@pytest.mark.parametrize("name", ALL + WRAPPED)
def test_admitting_a_block_larger_than_the_free_room_evicts_just_enough(name: str) -> None:
    p = make_policy(name, 100)
    _fill(p, [f"k{i}" for i in range(6)], size=15)  # 90 bytes: 10 free
    p.insert("big", 40)  # needs 30 more than is free: two 15-byte victims
    p.check_invariants()
    victims = _evict_to(p, 100, protect="big")
    assert len(victims) == 2 and "big" in p and "big" not in victims
    assert p.used_bytes == 100 and len(p) == 5
    assert all(k not in p and p.size_of(k) == 0 for k in victims)
    assert p.size_of("big") == 40
    p.insert("huge", 150)  # larger than the whole capacity: everything else goes
    evicted = _evict_to(p, 100, protect="huge")
    assert set(evicted) == {f"k{i}" for i in range(6)} - set(victims) | {"big"}
    assert p.resident() == ["huge"] and p.used_bytes == 150
    assert p.pop_victim(exclude=["huge"]) is None  # the cache streams such a block through
    p.check_invariants()


@pytest.mark.parametrize("name", ALL + WRAPPED)
def test_pinned_keys_leave_the_policy_and_come_back(name: str) -> None:
    """As the cache pins: remove the key, shrink the capacity by its size; unpin: resize
    back and insert again."""
    p = make_policy(name, 100)
    _fill(p, [f"k{i}" for i in range(10)])
    pinned = ["k0", "k5"]
    for k in pinned:
        assert p.remove(k) == 10
    p.resize(100 - 20)
    p.check_invariants()
    assert p.used_bytes == 80 and all(k not in p for k in pinned)
    for i in range(10, 30):  # churn: pinned keys are never victims, room is 80
        p.insert(f"k{i}", 10)
        victims = _evict_to(p, 80, protect=f"k{i}")
        assert not set(victims) & set(pinned)
        assert p.used_bytes <= 80
    p.resize(100)
    for k in pinned:
        p.insert(k, 10)
        p.check_invariants()
    assert all(k in p for k in pinned) and p.used_bytes == 100


@pytest.mark.parametrize("name", ALL + WRAPPED)
def test_resize_smaller_evicts_down_and_larger_keeps_everything(name: str) -> None:
    p = make_policy(name, 100)
    _fill(p, [f"k{i}" for i in range(10)])
    p.resize(40)
    p.check_invariants()
    assert p.used_bytes == 100  # resize evicts nothing itself
    victims = _evict_to(p, 40)
    assert len(victims) == 6 and p.used_bytes == 40 and len(p) == 4
    p.resize(0)
    p.check_invariants()
    assert len(_evict_to(p, 0)) == 4 and p.used_bytes == 0
    p.resize(1000)
    _fill(p, [f"n{i}" for i in range(20)])
    assert _evict_to(p, 1000) == [] and p.used_bytes == 200
    with pytest.raises(ValueError):
        type(p.inner if isinstance(p, HintedPolicy) else p)(-1)


def test_unknown_policy_name() -> None:
    with pytest.raises(
        ValueError, match="unknown cache policy 'fifo' \\(choose: arc, lru, s3fifo, sieve\\)"
    ):
        _make_named("fifo", 10)


# -- policy-specific -----------------------------------------------------------------


def test_lru_order() -> None:
    p = LRUPolicy(100)
    _fill(p, ["a", "b", "c"])
    p.access("a")
    assert p.resident() == ["b", "c", "a"]


def test_arc_resists_a_scan() -> None:
    """A working set seen twice survives a long one-time scan under ARC but not LRU."""
    hot = [f"hot{i}" for i in range(5)]
    results = {}
    for name in ALL:
        p = make_policy(name, 100)
        for k in hot:  # seen twice: T2 under ARC
            p.insert(k, 10)
            p.access(k)
        for i in range(50):  # one-time scan
            p.insert(f"scan{i}", 10)
            _evict_to(p, 100, protect=f"scan{i}")
        results[name] = sum(k in p for k in hot)
    assert results["arc"] == 5
    assert results["lru"] == 0


def test_arc_ghost_hit_in_b1_grows_p_and_b2_shrinks_it() -> None:
    p = ARCPolicy(30)
    p.insert("a", 10)
    p.access("a")  # a -> T2, so T1 alone never fills c (the paper's case IV.A)
    _fill(p, ["b", "c", "d"])
    _evict_to(p, 30, protect="d")  # b: T1 -> B1
    assert p.ghosts() == ["b"] and p.p == 0
    p.insert("b", 10)  # ghost hit in B1
    assert p.p == 10 and "b" in p.t2
    _evict_to(p, 30, protect="b")
    p.check_invariants()
    p.access("c")
    p.access("d")
    while p.t2_bytes and p.pop_victim(exclude=list(p.t1)):
        pass
    ghost_b2 = next(iter(p.b2))
    before = p.p
    p.insert(ghost_b2, 10)  # ghost hit in B2
    assert p.p < before
    p.check_invariants()


def test_arc_resize_clamps_p() -> None:
    p = ARCPolicy(100)
    p.p = 80.0
    p.resize(50)
    assert p.p == 50
    p.check_invariants()
