"""Strata's S3-FIFO against a reference simulator written from the paper.

The reference follows Algorithm 1 of Yang et al., "FIFO queues are all you need for cache
eviction" (SOSP 2023) line by line, for objects of one size (the paper counts entries):
S holds 10 % of the cache, M the rest, G as many entries as M; a hit raises a counter
capped at 3 and moves nothing; a miss first evicts while the cache is full, then inserts
into M when G remembers the key, else into S. EVICT takes from S while S holds at least
10 % of the cache, else from M. EVICTS moves S's tail to M when hit more than once
(``freq > 1``), evicting from M if that fills it, else drops it into G; EVICTM reinserts
M's tail with its counter lowered by one when it is non-zero, else evicts it.

One switch, ``warmup``: libCacheSim's ``S3FIFO.c`` (since December 2024, by the paper's
first author) sends a new key to M instead of S while the cache has not evicted yet and S
already holds its share. With it the reference gives libCacheSim's hit ratios (0.317 on
the loop below, the "independent implementation" of issue 25); without it, the SOSP runs'
``S3FIFOv0`` (0.266 there). Strata follows the warm-up rule.

Strata's policy is driven as the block cache drives it (``bench.policy_sim.simulate``:
admit, then evict to capacity, never the key just admitted), the reference as Algorithm 1
(evict, then insert), and M's overflow is trimmed a call later: the two differ by a few
hits, under a point on every trace (the issue's target: 2).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import pytest

from bench.policy_sim import simulate
from bench.traces import traces


class ReferenceS3FIFO:
    """Algorithm 1 over objects of one size; ``read`` returns whether it hit."""

    def __init__(self, cache_size: int, warmup: bool = True) -> None:
        self.cache_size = cache_size
        self.small_size = 0.1 * cache_size
        self.main_size = cache_size - self.small_size
        self.ghost_size = self.main_size
        self.warmup = warmup
        self.evicted_once = False
        self.small: OrderedDict[int, None] = OrderedDict()  # oldest first (the tail)
        self.main: OrderedDict[int, None] = OrderedDict()
        self.ghost: OrderedDict[int, None] = OrderedDict()
        self.freq: dict[int, int] = {}

    def read(self, x: int) -> bool:
        if x in self.freq:  # in S or in M
            self.freq[x] = min(self.freq[x] + 1, 3)
            return True
        self._insert(x)
        self.freq[x] = 0
        return False

    def _insert(self, x: int) -> None:
        while len(self.small) + len(self.main) >= self.cache_size:
            self._evict()
        if x in self.ghost:
            del self.ghost[x]
            self.main[x] = None
        elif self.warmup and not self.evicted_once and len(self.small) >= self.small_size:
            self.main[x] = None
        else:
            self.small[x] = None

    def _evict(self) -> None:
        self.evicted_once = True
        if len(self.small) >= self.small_size:
            self._evict_small()
        else:
            self._evict_main()

    def _evict_small(self) -> None:
        while self.small:
            t, _ = self.small.popitem(last=False)
            if self.freq[t] > 1:
                self.main[t] = None
                self.freq[t] = 0  # libCacheSim: the moved object starts afresh
                if len(self.main) >= self.main_size:
                    self._evict_main()
            else:
                del self.freq[t]
                self.ghost[t] = None
                while len(self.ghost) > self.ghost_size:
                    self.ghost.popitem(last=False)
                return

    def _evict_main(self) -> None:
        while self.main:
            t, _ = self.main.popitem(last=False)
            if self.freq[t] > 0:
                self.main[t] = None  # back to the head
                self.freq[t] -= 1
            else:
                del self.freq[t]
                return


def reference_ratio(keys: Sequence[int], cache_size: int, warmup: bool = True) -> float:
    ref = ReferenceS3FIFO(cache_size, warmup)
    return sum(ref.read(k) for k in keys) / len(keys)


def test_the_reference_by_hand() -> None:
    ref = ReferenceS3FIFO(10)  # S: 1 entry, M: 9, G: 9
    assert [ref.read(k) for k in range(10)] == [False] * 10
    assert list(ref.small) == [0] and list(ref.main) == list(range(1, 10))  # the warm-up
    assert ref.read(1) and ref.read(1) and ref.freq[1] == 2
    assert not ref.read(10)  # S at its share: 0 goes to G; 10 enters S
    assert list(ref.small) == [10] and list(ref.ghost) == [0] and ref.evicted_once
    assert not ref.read(11)  # 10 goes to G; 11 enters S
    assert not ref.read(0)  # a ghost hit: into M, after S's 11 went to G
    assert list(ref.main) == [*range(1, 10), 0] and list(ref.ghost) == [10, 11]
    assert not ref.read(12)  # S is empty: M's tail 1 (hit twice) goes round once, 2 goes
    assert list(ref.main) == [*range(3, 10), 0, 1] and ref.freq[1] == 1
    cold = ReferenceS3FIFO(10, warmup=False)
    for k in range(10):
        cold.read(k)
    assert list(cold.small) == list(range(10)) and not cold.main  # the SOSP runs' fill


def test_the_warm_up_is_the_loop_difference() -> None:
    loop = list(range(2000)) * 4
    assert reference_ratio(loop, 1333) == pytest.approx(0.317, abs=1e-3)  # libCacheSim's
    assert reference_ratio(loop, 1333, warmup=False) == pytest.approx(0.266, abs=5e-4)
    assert simulate("s3fifo", loop, 1333) == pytest.approx(reference_ratio(loop, 1333), abs=2e-3)


@pytest.mark.parametrize("seed", [0, 1])
def test_strata_matches_the_reference_on_every_policy_sim_trace(seed: int) -> None:
    for trace in traces(400, 3, seed):
        want = reference_ratio(trace.keys, trace.cache_blocks)
        got = simulate("s3fifo", trace.keys, trace.cache_blocks)
        assert abs(got - want) <= 0.01, f"{trace.name}: {got:.4f} against {want:.4f}"
