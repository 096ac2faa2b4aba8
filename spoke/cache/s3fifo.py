"""S3-FIFO eviction, byte-weighted.

Yang, Zhang, Qiu, Yue and Rashmi, "FIFO Queues are All You Need for Cache Eviction",
SOSP 2023 (Algorithm 1), with the details of libCacheSim's ``S3FIFO.c``, the paper's
first author's implementation.

Three FIFO queues: a small one, S (10 % of the capacity), that new keys enter; the main
one, M (the rest); and a ghost queue, G, of keys recently evicted from S (no data; as many
bytes as M may hold). Each resident key has a hit counter capped at 3 (two bits); a hit
moves nothing. A miss on a key in G admits it straight into M; any other miss into S,
except during the first fill. To evict:

* while S holds at least its 10 %, look at S's oldest key: hit at least twice while in
  S (``freq > 1``) -> move it to M with its counter cleared; otherwise evict it into G.
  Most keys are read once and leave quickly ("quick demotion of one-hit wonders");
* otherwise look at M's oldest key: with a non-zero counter it goes back to M's head with
  the counter lowered by one (FIFO-reinsertion with two bits); otherwise it is evicted.

The first fill (libCacheSim's ``S3FIFO.c`` since December 2024; the SOSP runs'
``S3FIFOv0`` had no such rule): until the cache first needs room, a new key that finds S
at its 10 % goes into M. It ends when the policy first evicts, when a key of S or M is
removed (a wrapping :class:`~spoke.cache.hinted.HintedPolicy` evicts that way), or when an
admission finds S and M over the capacity. Without it a cold cache first holds only S and
then empties it into G, key by key, before M holds anything: on a loop over data 1.5x the
cache that gave 0.267 where libCacheSim gives 0.317, and beside a one-time scan 0.306
against 0.385 (``bench.policy_sim``); with it Strata is within a point of a reference
written from Algorithm 1 on every trace there (``tests/unit/test_spoke_s3fifo_reference.py``;
and within 0.1 point of libCacheSim's own hit ratios at 2,000 blocks, checked once against
its Python bindings outside the project).

Byte weighting: queue sizes are byte totals; the cache calls
:meth:`~spoke.cache.policy.EvictionPolicy.pop_victim` until it is within capacity, one victim a
call. Algorithm 1 evicts from M inside EVICTS when a move fills M; here M may run over its
share for a moment instead, and since S is then under its own share the next victims come
from M (libCacheSim does the same). A block larger than S's share is still
admitted into S (and is the next victim but for hits).
"""

from __future__ import annotations

from collections import OrderedDict

from spoke.cache.policy import ByteWeightedPolicy

SMALL_SHARE = 0.10  # S's share of the capacity (the paper's 10 %)
GHOST_SHARE = 0.90  # G's bytes, as a share of the capacity (as much as M holds)
MOVE_THRESHOLD = 2  # hits in S that move a key to M (Algorithm 1: freq > 1)
MAX_FREQ = 3  # the two-bit counter's cap


class S3FIFOPolicy(ByteWeightedPolicy):
    """S3-FIFO (Yang et al., SOSP 2023), byte-weighted.

    Attributes:
        small, main: resident keys of S and M, oldest first.
        ghost: G, keys evicted from S -> their size then, oldest first.
        freq: resident key -> its hit counter (0..3).
        filled: the first fill is over (new keys no longer go to M when S is full).
    """

    name = "s3fifo"

    def __init__(self, capacity_bytes: int) -> None:
        super().__init__(capacity_bytes)
        self.small: OrderedDict[str, None] = OrderedDict()
        self.main: OrderedDict[str, None] = OrderedDict()
        self.ghost: OrderedDict[str, int] = OrderedDict()
        self.freq: dict[str, int] = {}
        self.small_bytes = self.main_bytes = self.ghost_bytes = 0
        self.filled = False  # the first fill is over (see the module docstring)

    @property
    def small_target(self) -> float:
        """S's share of the capacity, bytes."""
        return SMALL_SHARE * self.capacity_bytes

    @property
    def ghost_limit(self) -> float:
        """The most bytes G remembers."""
        return GHOST_SHARE * self.capacity_bytes

    def _admit(self, key: str, size: int) -> None:
        """A miss: into M if G remembers the key (or, during the first fill, when S already
        holds its share), else into S; counter 0."""
        self.freq[key] = 0
        if self.small_bytes + self.main_bytes + size > self.capacity_bytes:
            self.filled = True  # S and M with this key are over capacity: it will evict
        warming = not self.filled and self.small_bytes >= self.small_target
        if key in self.ghost or warming:
            self.ghost_bytes -= self.ghost.pop(key, 0)
            self.main[key] = None
            self.main_bytes += size
        else:
            self.small[key] = None
            self.small_bytes += size

    def _hit(self, key: str) -> None:
        """A hit raises the counter, capped at 3; nothing moves."""
        self.freq[key] = min(self.freq[key] + 1, MAX_FREQ)

    def _discard(self, key: str) -> None:
        if key in self.small or key in self.main:
            self.filled = True  # a key left (a wrapping HintedPolicy evicts this way)
        if key in self.small:
            del self.small[key]
            self.small_bytes -= self.size_of(key)
        elif key in self.main:
            del self.main[key]
            self.main_bytes -= self.size_of(key)
        self.freq.pop(key, None)
        if key in self.ghost:
            self.ghost_bytes -= self.ghost.pop(key)

    def _evict(self, skip: set[str]) -> str | None:
        """EVICT: from S while it holds its share, else from M (the other when the chosen
        queue has nothing outside ``skip``). The first call ends the warm-up. EVICTS may
        move every key it meets to M and evict none, so M is asked again after it."""
        self.filled = True
        if self.small_bytes >= self.small_target:
            return self._evict_small(skip) or self._evict_main(skip)
        return self._evict_main(skip) or self._evict_small(skip) or self._evict_main(skip)

    def _evict_small(self, skip: set[str]) -> str | None:
        """EVICTS: S's oldest keys hit twice move to M; the first other one goes to G."""
        while True:
            key = next((k for k in self.small if k not in skip), None)
            if key is None:
                return None
            size = self.size_of(key)
            del self.small[key]
            self.small_bytes -= size
            if self.freq[key] >= MOVE_THRESHOLD:
                self.main[key] = None
                self.main_bytes += size
                self.freq[key] = 0  # the access bits are cleared on the move
                continue
            del self.freq[key]
            self.ghost[key] = size
            self.ghost_bytes += size
            self._trim_ghost()
            return key

    def _evict_main(self, skip: set[str]) -> str | None:
        """EVICTM: M's oldest key goes back to the head if hit (counter - 1), else out."""
        while True:
            key = next((k for k in self.main if k not in skip), None)
            if key is None:
                return None
            if self.freq[key] > 0:
                self.freq[key] -= 1
                self.main.move_to_end(key)
                continue
            del self.main[key]
            del self.freq[key]
            self.main_bytes -= self.size_of(key)
            return key

    def _trim_ghost(self) -> None:
        while self.ghost and self.ghost_bytes > self.ghost_limit:
            _, size = self.ghost.popitem(last=False)
            self.ghost_bytes -= size

    def resize(self, capacity_bytes: int) -> None:
        """Change the capacity; S's share and G's bound follow it (G trimmed now)."""
        super().resize(capacity_bytes)
        self._trim_ghost()

    def _ranked(self) -> list[str]:
        """S then M, each oldest first, keys without hits first."""
        order = [*self.small, *self.main]
        return [k for k in order if not self.freq[k]] + [k for k in order if self.freq[k]]

    def ghosts(self) -> list[str]:
        """G's keys, oldest first."""
        return list(self.ghost)

    def check_invariants(self) -> None:
        """S and M partition the resident keys; byte totals match; G is disjoint from them
        and within its bound; counters are in 0..3."""
        super().check_invariants()
        assert set(self.small).isdisjoint(self.main), "a key is in S and M"
        assert set(self.small) | set(self.main) == self._ranked_keys, "S + M != ranked keys"
        assert set(self.ghost).isdisjoint(self._ranked_keys), "a ranked key is in G"
        assert self.small_bytes == sum(self.size_of(k) for k in self.small), "S bytes"
        assert self.main_bytes == sum(self.size_of(k) for k in self.main), "M bytes"
        assert self.ghost_bytes == sum(self.ghost.values()), "G bytes"
        assert all(s >= 0 for s in self.ghost.values()), "negative ghost size"
        assert self.ghost_bytes <= self.ghost_limit, "G over its bound"
        assert set(self.freq) == self._ranked_keys, "counters out of sync"
        assert all(0 <= f <= MAX_FREQ for f in self.freq.values()), "counter out of range"
