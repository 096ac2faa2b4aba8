"""Which connection a newcomer at the cap displaces (:func:`strata_local.slotshare.victim`,
and :class:`~strata_local.slotshare.Ledger`, which keeps the counts as they change and asks
a bounded number of connections): an address holding two more connections than the
newcomer's loses its longest-owing one whatever its age; otherwise the longest owing over
all, once it has owed ``after_s``."""

from __future__ import annotations

from collections import Counter

import pytest

from strata_local.slotshare import INSPECT, Ledger, victim

NOW = 100.0
AFTER = 0.05


def _pick(
    newcomer: str, owing: list[tuple[str, float, str]], extra: dict[str, int] | None = None
) -> str | None:
    """:func:`victim`'s pick; and the :class:`Ledger`'s, the same, where the connections
    arrived in the order they began to owe (a flood's owe from when they open), those
    being served (``extra``) first."""
    held = Counter(address for address, _, _ in owing)
    held.update(extra or {})
    picked = victim(newcomer, owing, held, NOW, AFTER)
    ledger: Ledger[str] = Ledger()
    since: dict[str, float | None] = {}
    for address, n in (extra or {}).items():
        for i in range(n):
            ledger.add(address, f"served-{address}{i}")
            since[f"served-{address}{i}"] = None
    for address, owed, conn in sorted(owing, key=lambda o: o[1]):
        ledger.add(address, conn)
        since[conn] = owed
    assert ledger.held == dict(held)
    assert ledger.victim(newcomer, since.__getitem__, NOW, AFTER) == picked
    return picked


def test_a_flooding_address_loses_its_youngest_slots_to_another_address() -> None:
    flood = [("flood", NOW - 0.001 * i, f"f{i}") for i in range(32)]  # all younger than AFTER
    assert _pick("kubelet", flood) == "f31"  # the one owing longest of the flood
    assert _pick("flood", flood) is None  # its own newcomer: no share to claim, none aged


def test_the_address_holding_most_loses_first() -> None:
    owing = [("a", NOW - 0.01, "a0"), ("a", NOW - 0.01, "a1"), ("a", NOW - 0.01, "a2")]
    owing += [("b", NOW - 0.02, f"b{i}") for i in range(4)]
    assert _pick("c", owing) == "b0"  # b holds 4, a 3: b first, though a's are as young


def test_one_more_is_not_over_a_share() -> None:
    owing = [("a", NOW - 0.01, "a0"), ("a", NOW - 0.01, "a1"), ("b", NOW - 0.01, "b0")]
    assert _pick("b", owing) is None  # b would hold 2 against a's 1: no change of hands
    assert _pick("c", owing) == "a0"  # c holds 0, a 2


def test_connections_being_served_count_toward_a_share_but_are_never_taken() -> None:
    owing = [("b", NOW - 0.01, "b0")]
    assert _pick("b", owing, extra={"a": 5}) is None  # a's five are being served
    assert _pick("c", owing, extra={"a": 5}) == "b0"  # a fresh address: b's, not a's
    assert _pick("e", owing, extra={"b": 2, "e": 1}) == "b0"  # b holds 3 in all, e 1


def test_a_fresh_address_takes_the_slot_owing_longest_of_one_holding_any() -> None:
    owing = [("a", NOW - 0.002, "a0"), ("b", NOW - 0.003, "b0"), ("c", NOW - 0.001, "c0")]
    assert _pick("d", owing) == "b0"  # 64 addresses of one each kept d out before
    assert _pick("d", [("c", NOW - 0.001, "c0")]) == "c0"


def test_among_equals_the_one_owing_longest_goes_once_aged() -> None:
    owing = [("a", NOW - 0.2, "a0"), ("b", NOW - 0.3, "b0"), ("c", NOW - 0.01, "c0")]
    assert _pick("c", owing) == "b0"  # c holds one, as a and b do: the age rule
    assert _pick("c", [("c", NOW - 0.01, "c0"), ("a", NOW - 0.02, "a0")]) is None


def test_the_ledger_asks_a_bounded_number_of_connections_and_forgets_the_ended() -> None:
    ledger: Ledger[str] = Ledger()
    asked: list[str] = []

    def owing_since(conn: str) -> float | None:
        asked.append(conn)
        return NOW - 1.0

    for i in range(256):
        ledger.add(f"10.0.{i % 64}.1", f"c{i}")
    assert ledger.victim("kubelet", owing_since, NOW, AFTER) == "c0"
    assert len(asked) <= INSPECT
    ledger.remove("c0")
    ledger.remove("c0")  # idempotent
    assert len(ledger) == 255 and ledger.held["10.0.0.1"] == 3
    asked.clear()
    assert ledger.victim("10.0.1.1", owing_since, NOW, AFTER) == "c1"  # its own, oldest
    assert len(asked) <= INSPECT  # the age rule: the first connections in arrival order


@pytest.mark.parametrize("flood", [1, 64])
def test_a_flood_through_the_ledger_never_takes_the_kubelets_fresh_slot(flood: int) -> None:
    ledger: Ledger[str] = Ledger()
    opened: dict[str, float] = {}
    now = NOW
    for i in range(255):
        opened[f"f{i}"] = now
        ledger.add(f"10.9.0.{i % flood}", f"f{i}")
        now += 0.001
    opened["kubelet"] = now
    ledger.add("10.0.0.1", "kubelet")
    for i in range(255, 2_000):  # the flood goes on at 1,000 a second
        now += 0.001
        chosen = ledger.victim(f"10.9.0.{i % flood}", opened.get, now, AFTER)
        assert chosen != "kubelet" or now - opened["kubelet"] > 0.2
        if chosen is None:
            continue
        ledger.remove(chosen)
        opened.pop(chosen)
        opened[f"f{i}"] = now
        ledger.add(f"10.9.0.{i % flood}", f"f{i}")
        if chosen == "kubelet":
            break
