"""Every eviction policy (LRU, ARC, SIEVE, S3-FIFO, and HintedPolicy over each) keeps its
invariants through random operations: hypothesis state machines of misses, prefetches,
hits, removals, pins, resizes, evictions and hint streams, with byte accounting checked
against a model that only sums sizes; and the S3-FIFO case one of them found."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from spoke.cache.hinted import HintedPolicy
from tests.unit.policy_support import KEYS, key_size, make_policy


def _invariant_machine(name: str) -> type[RuleBasedStateMachine]:
    """Random misses, hits, removals, pins, resizes and evictions (and, for HintedPolicy,
    hint streams installed, read along and cleared); every policy invariant is checked
    after every step, and byte accounting against a model that only sums sizes."""

    class InvariantMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.capacity = 10
            self.policy = make_policy(name, self.capacity)
            self.sizes: dict[str, int] = {}  # what should be resident -> size

        def _settle(self, protect: str | None) -> None:
            exclude = () if protect is None else (protect,)
            while self.policy.used_bytes > self.capacity:
                victim = self.policy.pop_victim(exclude)
                if victim is None:
                    assert set(self.sizes) <= set(exclude)  # only the protected key left
                    break
                key, size = victim
                assert key not in exclude and self.sizes.pop(key) == size
                self.policy.check_invariants()

        @rule(key=KEYS)
        def miss(self, key: str) -> None:
            self.policy.insert(key, key_size(key))
            self.sizes[key] = key_size(key)
            self.policy.check_invariants()
            self._settle(protect=key)

        @rule(key=KEYS)
        def prefetch(self, key: str) -> None:
            self.policy.insert(key, key_size(key), prefetched=True)
            self.sizes[key] = key_size(key)
            self.policy.check_invariants()
            self._settle(protect=key)

        @rule(key=KEYS)
        def hit(self, key: str) -> None:
            self.policy.access(key)

        @rule(key=KEYS)
        def drop(self, key: str) -> None:
            assert self.policy.remove(key) == self.sizes.pop(key, 0)

        @rule(key=KEYS)
        def pin_and_unpin(self, key: str) -> None:
            size = self.policy.remove(key)
            assert size == self.sizes.pop(key, 0)
            self.policy.resize(max(0, self.capacity - size))
            self.policy.check_invariants()
            self.policy.resize(self.capacity)
            if size:
                self.policy.insert(key, size)
                self.sizes[key] = size

        @rule(capacity=st.integers(min_value=0, max_value=16))
        def resize(self, capacity: int) -> None:
            self.capacity = capacity
            self.policy.resize(capacity)
            self.policy.check_invariants()
            self._settle(protect=None)

        @rule(exclude=st.sets(KEYS, max_size=4))
        def evict_one(self, exclude: set[str]) -> None:
            victim = self.policy.pop_victim(exclude)
            if victim is None:
                assert set(self.sizes) <= exclude
            else:
                assert victim[0] not in exclude and self.sizes.pop(victim[0]) == victim[1]

        @rule(plan=st.lists(KEYS, max_size=20), stream=st.sampled_from(["r0", "r1"]))
        def hint(self, plan: list[str], stream: str) -> None:
            if isinstance(self.policy, HintedPolicy):
                self.policy.set_hint(plan, stream=stream)

        @rule(key=KEYS)
        def observe(self, key: str) -> None:
            if isinstance(self.policy, HintedPolicy):
                self.policy.observe(key)

        @rule()
        def clear(self) -> None:
            if isinstance(self.policy, HintedPolicy):
                self.policy.clear_hint()

        @invariant()
        def consistent(self) -> None:
            p = self.policy
            p.check_invariants()
            resident = p.resident()
            assert sorted(resident) == sorted(self.sizes), "resident keys"
            assert len(p) == len(resident) and all(k in p for k in resident)
            assert p.used_bytes == sum(self.sizes.values()) == sum(map(p.size_of, resident))

    InvariantMachine.TestCase.settings = settings(
        max_examples=100, stateful_step_count=60, deadline=None
    )
    return InvariantMachine


TestLRUInvariants = _invariant_machine("lru").TestCase
TestARCInvariants = _invariant_machine("arc").TestCase
TestSIEVEInvariants = _invariant_machine("sieve").TestCase
TestS3FIFOInvariants = _invariant_machine("s3fifo").TestCase
TestHintedLRUInvariants = _invariant_machine("hinted+lru").TestCase
TestHintedARCInvariants = _invariant_machine("hinted+arc").TestCase
TestHintedSIEVEInvariants = _invariant_machine("hinted+sieve").TestCase
TestHintedS3FIFOInvariants = _invariant_machine("hinted+s3fifo").TestCase


@pytest.mark.parametrize("name", ["s3fifo", "hinted+s3fifo"])
def test_s3fifo_evicts_a_key_that_evicts_moved_from_s_to_m(name: str) -> None:
    """Found by the invariant machine: S below its share, M empty, S's only key hit twice.
    EVICTS moves it to M and evicts nothing; M must then be asked, not give up."""
    policy = make_policy(name, 11)
    policy.insert("k0", 1)
    policy.access("k0")
    policy.access("k0")
    assert policy.pop_victim(set()) == ("k0", 1)
    assert policy.resident() == []
