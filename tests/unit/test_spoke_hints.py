"""HintedPolicy: Belady's farthest-next-use eviction over a read-order hint (Belady 1966;
NoPFS, Dryden et al., SC 2021), cursor tolerance, and agreement with a naive MIN."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.policy_sim import belady
from spoke.hints import NEVER, HintedPolicy
from spoke.policy import ARCPolicy, LRUPolicy


def _replay(policy: HintedPolicy, keys: list[str], cache_blocks: int) -> float:
    hits = 0
    for key in keys:
        policy.observe(key)
        if key in policy:
            hits += 1
            policy.access(key)
        else:
            policy.insert(key, 1)
            while policy.used_bytes > cache_blocks and policy.pop_victim((key,)):
                pass
        policy.check_invariants()
    return hits / len(keys)


def test_evicts_the_block_read_farthest_in_the_future() -> None:
    p = HintedPolicy(LRUPolicy(3))
    p.set_hint(["a", "b", "c", "d", "b", "a", "c"])
    for key in ["a", "b", "c"]:
        p.observe(key)
        p.insert(key, 1)
    p.observe("d")
    p.insert("d", 1)
    # next reads: b at 4, a at 5, c at 6 -> c is farthest (LRU would pick a)
    assert p.next_use("c") == 6 and p.next_use("d") == NEVER
    assert p.pop_victim(("d",)) == ("c", 1)
    p.check_invariants()


def test_blocks_never_read_again_go_first_least_recent_first() -> None:
    p = HintedPolicy(ARCPolicy(10))
    p.set_hint(["a", "b", "a"])
    for key in ["x", "a", "y", "b"]:
        p.insert(key, 1)
    p.access("x")  # x more recent than y
    p.observe("a")
    assert p.pop_victim() == ("y", 1)
    assert p.pop_victim() == ("x", 1)
    assert p.pop_victim() == ("a", 1)  # next read at 2, b's at 1
    assert p.pop_victim() == ("b", 1)
    assert p.pop_victim() is None


def test_without_a_hint_it_is_the_wrapped_policy() -> None:
    p = HintedPolicy(LRUPolicy(3))
    for key in ["a", "b", "c"]:
        p.insert(key, 1)
    p.access("a")
    assert p.pop_victim() == ("b", 1)
    p.set_hint(["c", "a"])
    p.clear_hint()
    assert not p.active and p.pop_victim() == ("c", 1)


def test_out_of_order_reads_within_tolerance_and_repeated_reports() -> None:
    p = HintedPolicy(LRUPolicy(100), tolerance=4)
    order = [f"k{i}" for i in range(8)]
    p.set_hint(order * 2)
    for key in order:
        p.insert(key, 1)
    for key in ["k1", "k0", "k0", "k3", "k2", "k2"]:  # workers out of order, repeats
        p.observe(key)
    assert p.cursor == 4 and p.frontier == 4
    assert p.next_use("k0") == 8  # the repeat did not eat k0's second-epoch read
    assert p.next_use("k4") == 4
    assert not p.observe("k0")  # its next read (8) is beyond tolerance: not this soon
    p.check_invariants()


def test_unreported_reads_do_not_stall_the_cursor() -> None:
    p = HintedPolicy(LRUPolicy(100), tolerance=2)
    p.set_hint([f"k{i}" for i in range(10)])
    for i in range(1, 6):  # k0 is never reported
        assert p.observe(f"k{i}")
    assert p.cursor >= 1 and p.next_use("k0") == NEVER
    assert p.upcoming(2) == ["k6", "k7"]


def test_append_keeps_the_cursor_and_rebases() -> None:
    p = HintedPolicy(LRUPolicy(100))
    p.set_hint(["a", "b"])
    p.insert("a", 1)
    p.observe("a")
    p.observe("b")
    p.set_hint(["b", "a"], append=True)
    assert p.cursor == 0 and p.hint_length == 2 and p.next_use("a") == 1
    p.check_invariants()


@pytest.mark.parametrize("ratio", [1.5, 2.0])
def test_shuffled_epochs_match_belady(ratio: float) -> None:
    rng = random.Random(7)
    blocks, epochs = 60, 4
    keys: list[int] = []
    for _ in range(epochs):
        order = list(range(blocks))
        rng.shuffle(order)
        keys += order
    cache = int(blocks / ratio)
    p = HintedPolicy(ARCPolicy(cache))
    p.set_hint([str(k) for k in keys])
    assert _replay(p, [str(k) for k in keys], cache) == pytest.approx(belady(keys, cache))


@settings(max_examples=150, deadline=None)
@given(
    keys=st.lists(st.integers(min_value=0, max_value=9), min_size=1, max_size=80),
    cache=st.integers(min_value=1, max_value=6),
)
def test_hint_equal_to_the_trace_is_belady_optimal(keys: list[int], cache: int) -> None:
    p = HintedPolicy(ARCPolicy(cache))
    p.set_hint([str(k) for k in keys])
    assert _replay(p, [str(k) for k in keys], cache) == pytest.approx(belady(keys, cache))
