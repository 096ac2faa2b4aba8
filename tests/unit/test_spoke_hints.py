"""HintedPolicy: Belady's farthest-next-use eviction over a read-order hint (Belady 1966;
NoPFS, Dryden et al., SC 2021), cursor tolerance, and agreement with a naive MIN."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.policy_sim import belady
from bench.traces import lockstep_ranks
from spoke.cache.arc import ARCPolicy
from spoke.cache.hinted import NEVER, HintedPolicy, Victim
from spoke.cache.lru import LRUPolicy


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


def test_a_skipped_planned_read_stays_evictable() -> None:
    """Found by the invariant machine: a block the reader skipped is predicted at a clock
    time before now; that time must never read as "being read" (never evicted)."""
    p = HintedPolicy(LRUPolicy(10))
    p.set_hint(["k1", "k0"], stream="r1")
    p.insert("k1", 1)
    p.observe("k0")  # k1 skipped: overdue
    p.set_hint([], stream="r0")  # a second stream resyncs the predictions
    assert p.next_use("k1") < p.clock  # predicted in the past
    assert p.pop_victim(()) == ("k1", 1)
    p.check_invariants()


def test_done_blocks_go_first_least_recent_first_and_kept_unhinted_ones_last() -> None:
    p = HintedPolicy(ARCPolicy(10))
    p.set_hint(["d", "e", "a", "b", "a"])
    for key in ["d", "x", "e", "a", "y", "b"]:  # x and y: a job that posts no hint
        p.observe(key)
        p.insert(key, 1)
    p.access("d")  # d more recent than e
    p.check_invariants()
    assert p.pop_victim() == ("e", 1)  # done: no stream reads d, e or b again
    assert p.pop_victim() == ("b", 1)
    assert p.pop_victim() == ("d", 1)
    assert p.pop_victim() == ("a", 1)  # planned (read again at 4)
    assert p.pop_victim() == ("x", 1)  # the shadow keeps x and y: the wrapped policy's order
    assert p.pop_victim() == ("y", 1)
    assert p.pop_victim() is None
    p.check_invariants()


def test_unhinted_blocks_the_shadow_lets_go_go_before_planned_ones() -> None:
    p = HintedPolicy(LRUPolicy(3))
    p.set_hint(["a", "b", "a", "b"])
    assert _replay(p, ["a", "x", "y", "z"], 3) == 0.0  # z's room: a, read again farthest
    assert set(p.inner.resident()) == {"x", "y", "z"}
    p.observe("b")
    p.insert("b", 1)  # the shadow (LRU alone) lets x go for b: x goes, not b
    assert p.victims(1) == [Victim("x", 1, NEVER)]
    assert p.pop_victim(("b",)) == ("x", 1)
    p.check_invariants()
    assert [v.digest for v in p.victims(3)] == ["b"]  # y and z are kept: never listed
    assert _replay(p, ["y", "z"], 3) == 1.0  # the unhinted job hits as LRU alone would


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
    s = p.stream()
    assert s is not None and s.cursor == 4 and s.frontier == 4
    assert p.next_use("k0") == 8  # the repeat did not eat k0's second-epoch read
    assert p.next_use("k4") == 4
    assert not p.observe("k0")  # its next read (8) is beyond tolerance: not this soon
    p.check_invariants()


def test_unreported_reads_do_not_stall_the_cursor() -> None:
    p = HintedPolicy(LRUPolicy(100), tolerance=2)
    p.set_hint([f"k{i}" for i in range(10)])
    for i in range(1, 6):  # k0 is never reported
        assert p.observe(f"k{i}")
    s = p.stream()
    assert s is not None and s.cursor >= 1 and p.next_use("k0") == NEVER
    assert p.upcoming(2) == [(6, "k6"), (7, "k7")]


def test_append_keeps_the_cursor_and_rebases() -> None:
    p = HintedPolicy(LRUPolicy(100))
    p.set_hint(["a", "b"])
    p.insert("a", 1)
    p.observe("a")
    p.observe("b")
    s = p.set_hint(["b", "a"], append=True)
    assert s is not None and s.cursor == 0 and len(s) == 2
    assert p.next_use("a") == 3  # position 1 of the rebased stream, on the shared clock
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


def test_streams_share_a_clock_at_a_fair_share_each() -> None:
    p = HintedPolicy(LRUPolicy(100))
    p.set_hint(["a0", "a1", "a2", "a3"], stream="rank0")
    p.set_hint(["b0", "b1", "b2", "b3"], stream="rank1")
    # two streams: each is expected to advance one position every two reads
    assert p.next_use("a2") == p.next_use("b2") == 4.0
    p.set_hint(["a1"], stream="rank2")  # a1 is also rank2's first read, expected now
    assert p.next_use("a1") == 0.0


def test_a_read_counts_for_the_stream_that_expects_it_soonest() -> None:
    p = HintedPolicy(LRUPolicy(100))
    p.set_hint(["x", "a", "b"], stream="r0")
    p.set_hint(["c", "d", "x"], stream="r1")
    counted = p.observe("x")
    assert counted is not None and counted.name == "r0"  # r0 has it at its head
    r0, r1 = p.stream("r0"), p.stream("r1")
    assert r0 is not None and r1 is not None and (r0.cursor, r1.cursor) == (1, 0)
    assert p.observe("c") is r1 and p.observe("nowhere") is None
    assert p.clock == 2


def test_clearing_one_stream_keeps_the_others() -> None:
    p = HintedPolicy(LRUPolicy(100))
    for key in ["a", "b", "c"]:
        p.insert(key, 1)
    p.set_hint(["a", "b"], stream="r0")
    p.set_hint(["c"], stream="r1")
    assert p.clear_hint("r0") and not p.clear_hint("r0")
    assert set(p.streams) == {"r1"} and p.next_use("a") == NEVER
    # a and b are no one's plan now: unhinted, kept as LRU alone would keep them
    assert p.pop_victim() == ("c", 1)
    p.check_invariants()
    assert p.clear_hint() and not p.active and not p.evict_on_demand


def test_held_and_just_read_blocks_are_never_victims() -> None:
    p = HintedPolicy(LRUPolicy(100), in_use=1)
    p.set_hint(["a", "b", "c"])
    for key in ["a", "b", "c"]:
        p.insert(key, 1)
    p.hold(["c"])  # a reader waits for c
    p.observe("a")  # a was just read: protected until the next read
    assert [v.digest for v in p.victims(10)] == ["b"]
    assert p.pop_victim() == ("b", 1) and p.pop_victim() is None
    p.release(["c"])
    p.observe("b")  # b's read ends a's protection (in_use=1); b is not resident
    assert p.pop_victim() == ("a", 1)  # never read again
    p.check_invariants()


def test_victims_are_listed_in_eviction_order_without_evicting() -> None:
    p = HintedPolicy(LRUPolicy(100))
    p.set_hint(["a", "b", "c", "d"])
    for key in ["d", "c", "b", "a", "z"]:
        p.insert(key, 2)
    order = [(v.digest, v.next_use) for v in p.victims(6)]
    assert order == [("d", 3.0), ("c", 2.0), ("b", 1.0)]  # until 6 bytes are covered
    # z, in no plan, is kept for its reader (LRU alone keeps it): never listed
    assert len(p) == 5 and [v.digest for v in p.victims(100)] == ["d", "c", "b", "a"]
    p.check_invariants()


def test_a_stream_that_drifts_is_predicted_again_from_where_it_is() -> None:
    p = HintedPolicy(LRUPolicy(1000), tolerance=2)
    p.set_hint([f"a{i}" for i in range(100)], stream="fast")
    p.set_hint([f"b{i}" for i in range(100)], stream="slow")
    for i in range(30):  # only "fast" reads
        p.observe(f"a{i}")
    fast, slow = p.stream("fast"), p.stream("slow")
    assert fast is not None and slow is not None
    # predicted afresh from where each was then (slow has not moved), at half a position
    # per read: their next reads are both expected at that moment
    assert fast.t0 == slow.t0 > 0 and fast.p0 > 0 and slow.p0 == 0
    assert fast.when(fast.p0) == p.next_use("b0") == fast.t0
    assert p.next_use("b1") == fast.t0 + 2
    assert p.next_use(f"a{fast.p0 + 5}") == fast.t0 + 10


@pytest.mark.parametrize("readers", [2, 4])
def test_ranks_in_lockstep_match_belady(readers: int) -> None:
    blocks, cache = 80, 53  # data 1.5x the cache
    trace, plans = lockstep_ranks(blocks, 4, readers, 4, random.Random(readers))
    p = HintedPolicy(ARCPolicy(cache), in_use=1)
    for r, plan in enumerate(plans):
        p.set_hint([str(k) for k in plan], stream=f"rank{r}")
    hinted = _replay(p, [str(k) for k in trace], cache)
    assert hinted >= 0.95 * belady(trace, cache)
