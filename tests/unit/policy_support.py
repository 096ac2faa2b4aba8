"""What the eviction-policy tests share: a policy by name (``hinted`` and ``hinted+NAME``
wrap one in :class:`~spoke.cache.hinted.HintedPolicy`), the keys the hypothesis state
machines draw and their sizes, and :func:`reference_machine`, which drives a policy and a
naive reference model of it (with :class:`ColdEnd` for prefetched keys) through the same
random steps. Used by ``tests/unit/test_spoke_policy*.py``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from spoke.cache.arc import ARCPolicy
from spoke.cache.hinted import HintedPolicy
from spoke.cache.policy import EvictionPolicy
from spoke.cache.registry import make_policy as _make_named


def make_policy(name: str, capacity: int) -> EvictionPolicy:
    """A policy by name; ``hinted`` wraps ARC (and must behave exactly like it unhinted),
    ``hinted+NAME`` wraps NAME."""
    if name == "hinted":
        return HintedPolicy(ARCPolicy(capacity))
    if name.startswith("hinted+"):
        return HintedPolicy(_make_named(name.removeprefix("hinted+"), capacity))
    return _make_named(name, capacity)


class ColdEnd:
    """A reference model with the cold end every policy shares (``spoke.cache.policy``):
    prefetched keys wait unread, oldest first, outside the model's lists; victims come
    from them first; a key's first read is a miss of the model at that moment."""

    def __init__(self, ref: Any) -> None:
        self.ref = ref
        self.unread: list[str] = []
        self.size: dict[str, int] = {}

    def insert(self, k: str, s: int, prefetched: bool = False) -> None:
        if k in self.unread:
            if not prefetched:
                self.access(k)
        elif prefetched:
            if k not in self.ref.resident():
                self.unread.append(k)
                self.size[k] = s
        else:
            self.ref.insert(k, s)

    def access(self, k: str) -> None:
        if k in self.unread:
            self.unread.remove(k)
            self.ref.insert(k, self.size[k])
        else:
            self.ref.access(k)

    def remove(self, k: str) -> None:
        if k in self.unread:
            self.unread.remove(k)
        self.ref.remove(k)  # its ghosts too

    def pop_victim(self, exclude: tuple[str, ...]) -> str | None:
        for k in self.unread:
            if k not in exclude:
                self.unread.remove(k)
                return k
        victim: str | None = self.ref.pop_victim(exclude)
        return victim

    def resize(self, c: int) -> None:
        self.ref.resize(c)

    def resident(self) -> list[str]:
        return [*self.unread, *self.ref.resident()]

    def used(self) -> int:
        return sum(self.size[k] for k in self.unread) + int(self.ref.used())


KEYS = st.sampled_from([f"k{i}" for i in range(12)])


def key_size(key: str) -> int:
    return 1 + int(key[1:]) % 4  # content-addressed: a key always has one size


def reference_machine(
    make: Callable[[int], EvictionPolicy],
    ref: Callable[[int], Any],
    structure: Callable[[EvictionPolicy, Any], None],
    *,
    ordered: bool = True,
    max_examples: int = 150,
) -> type[RuleBasedStateMachine]:
    """A state machine that drives a policy and its reference model (one written from the
    paper, in the test module, with :class:`ColdEnd` for prefetched keys) with the same
    random steps and checks after every step that they agree: victims, resident keys (in
    order when ``ordered``), bytes, and what ``structure(real, ref)`` asserts of the
    policy's own lists."""

    class PolicyMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.capacity = 10
            self.real = make(self.capacity)
            self.ref = ColdEnd(ref(self.capacity))

        def _settle(self, protect: str | None) -> None:
            exclude = () if protect is None else (protect,)
            while self.real.used_bytes > self.capacity:
                got = self.real.pop_victim(exclude)
                want = self.ref.pop_victim(exclude)
                assert (got[0] if got else None) == want
                if got is None:
                    break

        @rule(key=KEYS)
        def miss(self, key: str) -> None:
            self.real.insert(key, key_size(key))
            self.ref.insert(key, key_size(key))
            self._settle(protect=key)

        @rule(key=KEYS)
        def prefetch(self, key: str) -> None:
            self.real.insert(key, key_size(key), prefetched=True)
            self.ref.insert(key, key_size(key), prefetched=True)
            self._settle(protect=key)

        @rule(key=KEYS)
        def hit(self, key: str) -> None:
            self.real.access(key)
            self.ref.access(key)

        @rule(key=KEYS)
        def drop(self, key: str) -> None:
            self.real.remove(key)
            self.ref.remove(key)

        @rule(capacity=st.integers(min_value=4, max_value=16))
        def resize(self, capacity: int) -> None:
            self.capacity = capacity
            self.real.resize(capacity)
            self.ref.resize(capacity)
            self._settle(protect=None)

        @invariant()
        def agrees_with_reference(self) -> None:
            self.real.check_invariants()
            if ordered:
                assert self.real.resident() == self.ref.resident()
            else:
                assert sorted(self.real.resident()) == sorted(self.ref.resident())
            assert self.real.used_bytes == self.ref.used()
            structure(self.real, self.ref.ref)

    PolicyMachine.TestCase.settings = settings(
        max_examples=max_examples, stateful_step_count=60, deadline=None
    )
    return PolicyMachine
