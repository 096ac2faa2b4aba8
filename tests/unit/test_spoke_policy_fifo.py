"""SIEVE and S3-FIFO: their papers' behaviour step by step, and hypothesis state machines
against naive reference models (plain lists, indices, sums recomputed).

The contract suite every policy passes (byte-weighted admission, pins, resize) is in
test_spoke_policy.py, the invariants through random operations in
test_spoke_policy_invariants.py."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis.stateful import RuleBasedStateMachine

from spoke.cache.policy import EvictionPolicy
from spoke.cache.s3fifo import S3FIFOPolicy
from spoke.cache.sieve import SIEVEPolicy
from tests.unit.policy_support import reference_machine


def _fill(policy: EvictionPolicy, keys: list[str], size: int = 10) -> None:
    for k in keys:
        policy.insert(k, size)
        policy.check_invariants()


def _admit(policy: EvictionPolicy, key: str, capacity: int, size: int = 10) -> list[str]:
    """A miss as the cache handles it: admit, then evict (never ``key``) to capacity."""
    policy.insert(key, size)
    out = []
    while policy.used_bytes > capacity:
        victim = policy.pop_victim((key,))
        assert victim is not None
        out.append(victim[0])
        policy.check_invariants()
    return out


# -- SIEVE (Zhang et al., NSDI 2024, Algorithm 1) ------------------------------------


def test_sieve_hand_clears_visited_bits_and_stays_where_it_evicted() -> None:
    p = SIEVEPolicy(40)
    _fill(p, ["a", "b", "c", "d"])  # queue, oldest first: a b c d
    p.access("a")
    p.access("c")
    assert p.hand is None and p.visited("a") and not p.visited("b")
    assert _admit(p, "e", 40) == ["b"]  # a: bit cleared, b: evicted
    assert not p.visited("a") and p.hand == "c"  # the hand stays at the next newer key
    assert _admit(p, "f", 40) == ["d"]  # c: bit cleared, d: evicted
    assert p.hand == "e"
    assert _admit(p, "g", 40) == ["e"]  # a new key not hit since: quick demotion
    assert p.hand == "f"
    assert _admit(p, "h", 40) == ["f"]
    assert p.hand == "g"  # g was admitted at the head: the hand got there
    assert _admit(p, "i", 40) == ["g"]
    assert p.hand == "h"
    p.access("h")
    p.access("i")
    # h, i: bits cleared; j (new, protected) is the head: the hand wraps to the tail,
    # where a's bit was cleared on the first lap
    assert _admit(p, "j", 40) == ["a"]
    assert p.hand == "c" and not p.visited("h") and not p.visited("i")
    assert [n.key for n in p._walk()] == ["c", "h", "i", "j"]


def test_sieve_hits_do_not_move_keys() -> None:
    p = SIEVEPolicy(100)
    _fill(p, ["a", "b", "c"])
    p.access("a")
    p.access("a")
    assert p._walk()[0].key == "a"  # still the oldest, only its bit is set
    assert p.resident() == ["b", "c", "a"]  # the order a sweep from the tail evicts in


def test_sieve_removing_the_hand_moves_it_on() -> None:
    p = SIEVEPolicy(30)
    _fill(p, ["a", "b", "c"])
    p.access("a")
    p.access("c")
    assert _admit(p, "d", 30) == ["b"] and p.hand == "c"
    assert p.remove("c") == 10
    assert p.hand == "d"
    p.check_invariants()
    p.remove("d")
    assert p.hand is None  # d was the head
    p.check_invariants()


def test_sieve_skips_excluded_keys_without_clearing_their_bit() -> None:
    p = SIEVEPolicy(100)
    _fill(p, ["a", "b"])
    p.access("a")
    assert p.pop_victim(exclude=["a"]) == ("b", 10)
    assert p.visited("a")
    assert p.pop_victim(exclude=["a"]) is None
    assert p.pop_victim() == ("a", 10) and len(p) == 0


# -- S3-FIFO (Yang et al., SOSP 2023, Algorithm 1) ------------------------------------


def _steady(capacity: int) -> S3FIFOPolicy:
    """An S3-FIFO policy past its first fill (every new key enters S, as in Algorithm 1);
    the warm-up has a test of its own."""
    p = S3FIFOPolicy(capacity)
    p.filled = True
    return p


def test_s3fifo_first_fill_puts_keys_past_smalls_share_into_main() -> None:
    p = S3FIFOPolicy(100)  # S's share: 10 bytes
    _fill(p, [f"k{i}" for i in range(10)])
    assert list(p.small) == ["k0"] and list(p.main) == [f"k{i}" for i in range(1, 10)]
    assert not p.filled
    assert _admit(p, "n0", 100) == ["k0"]  # the cache is full: n0 enters S, S evicts
    assert p.filled and list(p.small) == ["n0"] and p.ghosts() == ["k0"]
    assert _admit(p, "n1", 100) == ["n0"]  # from now on every new key enters S
    assert list(p.small) == ["n1"]


def test_s3fifo_first_fill_ends_when_a_key_leaves() -> None:
    p = S3FIFOPolicy(100)
    _fill(p, ["a", "b"])
    assert p.remove("b") == 10 and p.filled  # a wrapping HintedPolicy evicts this way
    _fill(p, ["c"])
    assert list(p.small) == ["a", "c"] and not p.main
    q = S3FIFOPolicy(100)
    _fill(q, ["a"])
    assert q.remove("ghost-of-nothing") == 0 and not q.filled
    assert q.pop_victim() == ("a", 10) and q.filled


def test_s3fifo_one_hit_wonders_leave_through_small_and_ghost_hits_enter_main() -> None:
    p = _steady(100)  # S holds 10 bytes, G remembers 90
    _fill(p, [f"k{i}" for i in range(10)])
    assert list(p.small) == [f"k{i}" for i in range(10)] and not p.main
    p.access("k1")  # one hit: not enough to reach M
    assert _admit(p, "n0", 100) == ["k0"]
    assert _admit(p, "n1", 100) == ["k1"]
    assert p.ghosts() == ["k0", "k1"]
    assert _admit(p, "k0", 100) == ["k2"]  # a ghost hit: straight into M
    assert list(p.main) == ["k0"] and "k0" not in p.ghost and p.freq["k0"] == 0


def test_s3fifo_twice_hit_moves_to_main_with_its_counter_cleared() -> None:
    p = _steady(100)
    _fill(p, [f"k{i}" for i in range(10)])
    p.access("k0")
    p.access("k0")  # hit twice in S (freq > 1): moves to M when it reaches S's tail
    for _ in range(4):
        p.access("k1")
    assert p.freq["k0"] == 2 and p.freq["k1"] == 3  # two bits: capped at 3
    assert _admit(p, "n0", 100) == ["k2"]  # k0 and k1 moved to M on the way
    assert list(p.main) == ["k0", "k1"] and p.freq["k0"] == p.freq["k1"] == 0
    assert p.ghosts() == ["k2"]


def test_s3fifo_main_reinserts_a_hit_key_with_its_counter_lowered() -> None:
    p = _steady(100)  # S: 10 bytes, G: 90 bytes
    for i in range(10):
        _admit(p, f"a{i}", 100)
    for i in range(10):
        _admit(p, f"b{i}", 100)  # a0..a9 leave S for G, which keeps the newest 90 bytes
    assert p.ghosts() == [f"a{i}" for i in range(1, 10)]
    for i in range(1, 10):
        assert _admit(p, f"a{i}", 100) == [f"b{i - 1}"]  # ghost hits enter M
    assert list(p.main) == [f"a{i}" for i in range(1, 10)] and list(p.small) == ["b9"]
    p.access("a1")
    assert _admit(p, "b0", 100) == ["b9"]  # S at its 10 %: S's key goes
    assert not p.small and p.main_bytes == 100
    assert _admit(p, "b1", 100) == ["a2"]  # S empty: M evicts; a1's hit bought a trip
    assert list(p.main) == [*(f"a{i}" for i in range(3, 10)), "b0", "b1", "a1"]
    assert p.freq["a1"] == 0


def test_s3fifo_ghost_remembers_at_most_mains_share() -> None:
    p = S3FIFOPolicy(100)
    for i in range(50):
        _admit(p, f"k{i}", 100)
    assert p.ghost_bytes == 90 and len(p.ghost) == 9
    p.resize(50)
    p.check_invariants()
    assert p.ghost_bytes <= 45


def test_s3fifo_keeps_a_hot_set_through_a_long_scan() -> None:
    p = S3FIFOPolicy(100)
    hot = [f"hot{i}" for i in range(5)]
    for k in hot:
        _admit(p, k, 100)
        p.access(k)
        p.access(k)
    for i in range(200):
        _admit(p, f"scan{i}", 100)
        if i % 10 == 0:
            for k in hot:
                p.access(k)
    assert all(k in p for k in hot)


# -- hypothesis: the real policies against naive references ------------------------------


class RefSIEVE:
    """SIEVE with a list (oldest first), a set of visited keys and the hand as a key."""

    def __init__(self, c: int) -> None:
        self.queue: list[str] = []
        self.visited: set[str] = set()
        self.size: dict[str, int] = {}
        self.hand: str | None = None

    def insert(self, k: str, s: int) -> None:
        if k in self.queue:
            self.visited.add(k)
            return
        self.queue.append(k)
        self.size[k] = s

    def access(self, k: str) -> None:
        if k in self.queue:
            self.visited.add(k)

    def _drop(self, k: str) -> None:
        i = self.queue.index(k)
        if self.hand == k:
            self.hand = self.queue[i + 1] if i + 1 < len(self.queue) else None
        self.queue.pop(i)
        self.visited.discard(k)

    def remove(self, k: str) -> None:
        if k in self.queue:
            self._drop(k)

    def pop_victim(self, exclude: tuple[str, ...]) -> str | None:
        if not self.queue:
            return None
        i = self.queue.index(self.hand) if self.hand is not None else 0
        for _ in range(2 * len(self.queue) + 1):
            k = self.queue[i]
            if k not in exclude:
                if k in self.visited:
                    self.visited.discard(k)
                else:
                    self.hand = k
                    self._drop(k)
                    return k
            i = (i + 1) % len(self.queue)
        return None

    def resize(self, c: int) -> None:
        pass

    def resident(self) -> list[str]:
        return list(self.queue)

    def used(self) -> int:
        return sum(self.size[k] for k in self.queue)


class RefS3FIFO:
    """S3-FIFO with three plain lists and a dict of counters; sums recomputed."""

    def __init__(self, c: int) -> None:
        self.c = c
        self.small: list[str] = []
        self.main: list[str] = []
        self.ghost: list[str] = []
        self.freq: dict[str, int] = {}
        self.size: dict[str, int] = {}
        self.filled = False  # libCacheSim's has_evicted

    def b(self, lst: list[str]) -> int:
        return sum(self.size[k] for k in lst)

    def insert(self, k: str, s: int) -> None:
        if k in self.small or k in self.main:
            self.access(k)
            return
        self.size[k] = s
        self.freq[k] = 0
        if self.b(self.small) + self.b(self.main) + s > self.c:
            self.filled = True
        if k in self.ghost:
            self.ghost.remove(k)
            self.main.append(k)
        elif not self.filled and self.b(self.small) >= 0.1 * self.c:
            self.main.append(k)  # the first fill: S has its share
        else:
            self.small.append(k)

    def access(self, k: str) -> None:
        if k in self.freq:
            self.freq[k] = min(3, self.freq[k] + 1)

    def remove(self, k: str) -> None:
        if k in self.small or k in self.main:
            self.filled = True
        for lst in (self.small, self.main, self.ghost):
            if k in lst:
                lst.remove(k)
        self.freq.pop(k, None)

    def _from_small(self, exclude: tuple[str, ...]) -> str | None:
        for k in list(self.small):
            if k in exclude:
                continue
            self.small.remove(k)
            if self.freq[k] > 1:
                self.main.append(k)
                self.freq[k] = 0
                continue
            del self.freq[k]
            self.ghost.append(k)
            while self.ghost and self.b(self.ghost) > 0.9 * self.c:
                self.ghost.pop(0)
            return k
        return None

    def _from_main(self, exclude: tuple[str, ...]) -> str | None:
        while True:
            k = next((k for k in self.main if k not in exclude), None)
            if k is None:
                return None
            self.main.remove(k)
            if self.freq[k] > 0:
                self.freq[k] -= 1
                self.main.append(k)
                continue
            del self.freq[k]
            return k

    def pop_victim(self, exclude: tuple[str, ...]) -> str | None:
        self.filled = True
        if self.b(self.small) >= 0.1 * self.c:
            return self._from_small(exclude) or self._from_main(exclude)
        return self._from_main(exclude) or self._from_small(exclude)

    def resize(self, c: int) -> None:
        self.c = c
        while self.ghost and self.b(self.ghost) > 0.9 * self.c:
            self.ghost.pop(0)

    def resident(self) -> list[str]:
        return [*self.small, *self.main]

    def used(self) -> int:
        return self.b(self.resident())


def _fifo_structure(policy: EvictionPolicy, ref: RefSIEVE | RefS3FIFO) -> None:
    """The policy's own queues, hand, bits and counters equal the reference's."""
    if isinstance(policy, SIEVEPolicy) and isinstance(ref, RefSIEVE):
        assert [n.key for n in policy._walk()] == ref.queue
        assert policy.hand == ref.hand
        assert all(policy.visited(k) == (k in ref.visited) for k in ref.queue)
    if isinstance(policy, S3FIFOPolicy) and isinstance(ref, RefS3FIFO):
        assert list(policy.small) == ref.small
        assert list(policy.main) == ref.main
        assert policy.ghosts() == ref.ghost
        assert policy.freq == ref.freq
        assert policy.filled == ref.filled


def _machine(
    make: Callable[[int], EvictionPolicy], ref: Callable[[int], RefSIEVE | RefS3FIFO]
) -> type[RuleBasedStateMachine]:
    return reference_machine(
        make,
        ref,
        _fifo_structure,  # type: ignore[arg-type]
        ordered=False,
        max_examples=100,
    )


TestSIEVEAgainstReference = _machine(SIEVEPolicy, RefSIEVE).TestCase
TestS3FIFOAgainstReference = _machine(S3FIFOPolicy, RefS3FIFO).TestCase
