"""Which connection a newcomer at the cap displaces (:func:`strata_local.slotshare.victim`):
an address holding two more connections than the newcomer's loses its longest-owing one
whatever its age; otherwise the longest owing over all, once it has owed ``after_s``."""

from __future__ import annotations

from collections import Counter

from strata_local.slotshare import victim

NOW = 100.0
AFTER = 0.05


def _pick(
    newcomer: str, owing: list[tuple[str, float, str]], extra: dict[str, int] | None = None
) -> str | None:
    held = Counter(address for address, _, _ in owing)
    held.update(extra or {})
    return victim(newcomer, owing, held, NOW, AFTER)


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
