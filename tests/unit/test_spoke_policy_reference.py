"""LRU and ARC (and HintedPolicy over ARC, unhinted) against naive reference models written
from their definitions (plain lists, sums recomputed): hypothesis state machines drive the
real policy and its model with the same random steps and check after every step that
victims, resident keys, bytes, ARC's ghosts and its target ``p`` agree."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis.stateful import RuleBasedStateMachine

from spoke.cache.arc import ARCPolicy
from spoke.cache.hinted import HintedPolicy
from spoke.cache.policy import EvictionPolicy
from tests.unit.policy_support import make_policy, reference_machine


class RefLRU:
    """LRU as a plain list, LRU first."""

    def __init__(self, c: int) -> None:
        self.c = c
        self.order: list[str] = []
        self.size: dict[str, int] = {}

    def insert(self, k: str, s: int) -> None:
        if k in self.order:
            self.access(k)
            return
        self.order.append(k)
        self.size[k] = s

    def access(self, k: str) -> None:
        if k in self.order:
            self.order.remove(k)
            self.order.append(k)

    def remove(self, k: str) -> None:
        if k in self.order:
            self.order.remove(k)

    def pop_victim(self, exclude: tuple[str, ...]) -> str | None:
        for k in self.order:
            if k not in exclude:
                self.order.remove(k)
                return k
        return None

    def resize(self, c: int) -> None:
        self.c = c

    def resident(self) -> list[str]:
        return list(self.order)

    def used(self) -> int:
        return sum(self.size[k] for k in self.order)


class RefARC:
    """ARC (Megiddo & Modha 2003, Fig. 4), byte-weighted, with four plain lists."""

    def __init__(self, c: int) -> None:
        self.c = c
        self.t1: list[str] = []
        self.t2: list[str] = []
        self.b1: list[str] = []
        self.b2: list[str] = []
        self.size: dict[str, int] = {}
        self.p = 0.0
        self.last_b2 = False

    def b(self, lst: list[str]) -> int:
        return sum(self.size[k] for k in lst)

    def insert(self, k: str, s: int) -> None:
        if k in self.t1 or k in self.t2:
            self.access(k)
            return
        self.size[k] = s
        self.last_b2 = False
        if k in self.b1:
            self.p = min(
                float(self.c), self.p + s * max(1.0, self.b(self.b2) / max(self.b(self.b1), 1))
            )
            self.b1.remove(k)
            self.t2.append(k)
        elif k in self.b2:
            self.p = max(0.0, self.p - s * max(1.0, self.b(self.b1) / max(self.b(self.b2), 1)))
            self.b2.remove(k)
            self.t2.append(k)
            self.last_b2 = True
        else:
            self.t1.append(k)
            self.trim()

    def access(self, k: str) -> None:
        if k in self.t1:
            self.t1.remove(k)
            self.t2.append(k)
        elif k in self.t2:
            self.t2.remove(k)
            self.t2.append(k)

    def remove(self, k: str) -> None:
        for lst in (self.t1, self.t2, self.b1, self.b2):
            if k in lst:
                lst.remove(k)

    def pop_victim(self, exclude: tuple[str, ...]) -> str | None:
        t1 = self.b(self.t1)
        take_t1 = t1 > 0 and (t1 > self.p or (self.last_b2 and t1 >= self.p))
        pairs = [(self.t1, self.b1), (self.t2, self.b2)]
        for res, ghost in pairs if take_t1 else pairs[::-1]:
            for k in res:
                if k not in exclude:
                    res.remove(k)
                    ghost.append(k)
                    self.trim()
                    return k
        return None

    def trim(self) -> None:
        while self.b1 and self.b(self.t1) + self.b(self.b1) > self.c:
            self.b1.pop(0)
        while self.b2 and sum(self.b(x) for x in (self.t1, self.t2, self.b1, self.b2)) > 2 * self.c:
            self.b2.pop(0)

    def resize(self, c: int) -> None:
        self.c = c
        self.p = min(self.p, float(c))
        self.trim()

    def resident(self) -> list[str]:
        return [*self.t1, *self.t2]

    def used(self) -> int:
        return self.b(self.resident())


def _arc_structure(policy: EvictionPolicy, ref: Any) -> None:
    real = policy.inner if isinstance(policy, HintedPolicy) else policy
    if isinstance(real, ARCPolicy) and isinstance(ref, RefARC):
        assert real.ghosts() == [*ref.b1, *ref.b2]
        assert real.p == pytest.approx(ref.p)


def _machine(name: str, ref: Callable[[int], RefLRU | RefARC]) -> type[RuleBasedStateMachine]:
    return reference_machine(lambda c: make_policy(name, c), ref, _arc_structure)


TestLRUAgainstReference = _machine("lru", RefLRU).TestCase
TestARCAgainstReference = _machine("arc", RefARC).TestCase
TestUnhintedAgainstARCReference = _machine("hinted", RefARC).TestCase
