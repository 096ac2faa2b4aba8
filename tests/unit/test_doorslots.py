"""The peer port's slot shares (strata_local/doorslots.py): which connection a newcomer at the
cap displaces, when proven connections give way (by address, then by who proved them),
and the counts."""

from __future__ import annotations

import pytest

from strata_local.doorslots import DoorSlot, DoorSlots


class Held:
    """The connections a test opened, and which of them were closed (displaced)."""

    def __init__(self, slots: DoorSlots) -> None:
        self.slots = slots
        self.closed: list[str] = []

    def open(self, host: str, name: str) -> DoorSlot | None:
        return self.slots.take(host, f"ipv4:{host}:{name}", lambda: self.closed.append(name))


def test_a_newcomer_displaces_the_oldest_connection_of_the_address_holding_most() -> None:
    held = Held(DoorSlots(4))
    held.open("10.0.0.1", "a1")
    held.open("10.0.0.2", "b1")
    held.open("10.0.0.2", "b2")
    held.open("10.0.0.1", "a2")
    assert held.open("10.0.0.3", "c1") is not None  # 10.0.0.1 and .2 hold two: .2 first
    assert held.closed == ["b1"]
    assert held.open("10.0.0.3", "c2") is not None  # .1 holds two now
    assert held.closed == ["b1", "a1"]
    assert held.slots.open == 4 and held.slots.displaced == 2


def test_a_flood_from_one_address_only_turns_its_own_connections_over() -> None:
    held = Held(DoorSlots(8))
    held.open("10.0.0.9", "peer")
    for i in range(1000):
        assert held.open("10.0.0.66", f"f{i}") is not None
    assert "peer" not in held.closed
    assert held.closed == [f"f{i}" for i in range(1000 - 7)]
    assert [s.who for s in held.slots.unproven("10.0.0.66")] == [
        f"ipv4:10.0.0.66:f{i}" for i in range(993, 1000)
    ]


def test_a_flood_from_many_addresses_turns_slots_over_in_arrival_order() -> None:
    held = Held(DoorSlots(4))
    for i in range(4):
        held.open(f"10.1.0.{i}", f"f{i}")
    held.open("10.0.0.9", "peer")  # displaces the first flood connection
    held.open("10.1.0.4", "f4")
    held.open("10.1.0.5", "f5")
    assert held.closed == ["f0", "f1", "f2"]
    held.open("10.1.0.6", "f6")
    assert held.closed[-1] == "f3"
    held.open("10.1.0.7", "f7")  # the peer is the oldest unproven connection now
    assert held.closed[-1] == "peer"


def test_proven_connections_of_distinct_holders_are_kept_and_a_full_house_refuses() -> None:
    held = Held(DoorSlots(2))
    peer = held.open("10.0.0.9", "peer")
    assert peer is not None
    held.slots.prove(peer, "token 1")
    held.slots.prove(peer, "token 1")  # idempotent
    for i in range(50):
        held.open("10.0.0.66", f"f{i}")
    assert "peer" not in held.closed and held.slots.proven == 1
    other = held.slots.unproven("10.0.0.66")[0]
    held.slots.prove(other, "token 2")
    assert held.open("10.0.0.67", "late") is None
    assert held.slots.refused == 1 and held.slots.open == 2
    held.slots.release(peer)
    held.slots.release(peer)  # idempotent
    assert held.slots.open == 1 and held.slots.proven == 1
    assert held.open("10.0.0.67", "late") is not None


def test_a_released_slot_is_not_proven_or_displaced_later() -> None:
    held = Held(DoorSlots(2))
    gone = held.open("10.0.0.1", "gone")
    assert gone is not None
    held.slots.release(gone)
    held.slots.prove(gone, "token 1")
    assert held.slots.open == 0 and held.slots.proven == 0
    assert held.slots.unproven("10.0.0.1") == []
    held.open("10.0.0.2", "x")
    held.open("10.0.0.2", "y")
    held.open("10.0.0.3", "z")
    assert held.closed == ["x"]  # never the released one's close


def test_counts_stay_exact_through_mixed_arrivals_proofs_and_releases() -> None:
    slots = DoorSlots(16)
    live: list[DoorSlot] = []
    for i in range(2_000):
        slot = slots.take(f"10.0.{i % 7}.{i % 3}", str(i), lambda: None)
        if slot is None:
            continue
        live = [s for s in live if s.open] + [slot]
        if i % 3 == 0:
            slots.answer(slot)
        if i % 5 == 0:
            slots.prove(slot, f"token {i % 4}")
        if i % 11 == 0:
            slots.release(live[0])
        if slots.proven >= 15:  # keep room for newcomers
            for s in live:
                slots.release(s)
    still = [s for s in live if s.open]
    assert slots.open == len(still) <= 16
    assert slots.proven == sum(s.proven for s in still)
    assert slots.answered == sum(s.answered for s in still)
    unproven = {s.host for s in still if not s.proven}
    assert sum(len(slots.unproven(h)) for h in unproven) == slots.open - slots.proven


def test_a_cap_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        DoorSlots(0)


def test_one_address_proving_every_slot_gives_way_to_another_address() -> None:
    """The sixteenth probe: one token holder proved 2,048 connections from one address and
    every new caller was refused. Proven connections are shared by address: a newcomer
    from an address holding two fewer displaces the oldest of the one holding most."""
    held = Held(DoorSlots(4))
    hog = [held.open("10.0.0.66", f"h{i}") for i in range(4)]
    for slot in hog:
        assert slot is not None
        held.slots.prove(slot, "token 66")
    spoke = held.open("10.0.0.9", "spoke")
    assert spoke is not None and held.closed == ["h0"]
    held.slots.prove(spoke, "token 9")
    assert held.open("10.0.0.10", "spoke2") is not None  # .66 holds 3, .10 none
    assert held.closed == ["h0", "h1"]
    assert held.slots.proven == 3 and held.slots.open == 4  # spoke2 not proven yet
    assert held.open("10.0.0.11", "spoke3") is not None  # displaces spoke2, unproven
    assert held.closed[-1] == "spoke2"


def test_spokes_holding_one_proven_connection_each_are_not_turned_over() -> None:
    held = Held(DoorSlots(3))
    for i in range(3):
        slot = held.open(f"10.0.0.{i}", f"s{i}")
        assert slot is not None
        held.slots.prove(slot, f"token {i}")
    assert held.open("10.0.0.9", "late") is None  # none holds two more than it
    assert held.closed == [] and held.slots.refused == 1


def test_one_holder_over_many_addresses_gives_way_to_a_newcomer() -> None:
    """The seventeenth probe: one token's holder proved one connection from each of 2,048
    addresses, and every new spoke was refused. Past its share (the slots over the holders
    and the newcomer) a holder's oldest proven connection gives way."""
    held = Held(DoorSlots(6))
    for i in range(5):
        slot = held.open(f"10.2.0.{i}", f"h{i}")
        assert slot is not None
        held.slots.prove(slot, "token hog")
    spoke = held.open("10.0.0.9", "spoke")
    assert spoke is not None
    held.slots.prove(spoke, "token spoke")
    spoke2 = held.open("10.0.0.10", "spoke2")
    assert spoke2 is not None  # the hog holds 5 > 6 / 3
    assert held.closed == ["h0"]
    held.slots.prove(spoke2, "token spoke2")
    for i in range(5, 50):  # the hog's newcomers turn over only its own
        slot = held.open(f"10.2.0.{i}", f"h{i}")
        assert slot is not None
        held.slots.prove(slot, "token hog")
    assert "spoke" not in held.closed and "spoke2" not in held.closed


def test_a_holder_within_its_share_is_not_displaced() -> None:
    held = Held(DoorSlots(4))
    for i, holder in enumerate(["a", "a", "b", "b"]):
        slot = held.open(f"10.3.0.{i}", f"{holder}{i}")
        assert slot is not None
        held.slots.prove(slot, holder)
    assert held.open("10.0.0.9", "late") is not None  # 2 > 4 / 3: a's oldest goes
    assert held.closed == ["a0"]
    late = held.slots.unproven("10.0.0.9")[0]
    held.slots.prove(late, "c")  # a 1, b 2, c 1: b holds 2, 2 × 4 > 4
    assert held.open("10.0.0.10", "later") is not None and held.closed[-1] == "b2"
    later = held.slots.unproven("10.0.0.10")[0]
    held.slots.prove(later, "d")  # one each now: never displaced
    assert held.open("10.0.0.11", "last") is None


def test_a_proof_taken_back_makes_the_connection_displaceable_again() -> None:
    """The seventeenth probe: connections that proved a token later revoked stayed proven
    (their calls refused UNAUTHENTICATED) and kept their slots."""
    held = Held(DoorSlots(2))
    a = held.open("10.0.0.1", "a")
    b = held.open("10.0.0.2", "b")
    assert a is not None and b is not None
    held.slots.prove(a, "token a")
    held.slots.prove(b, "token b")
    assert held.open("10.0.0.3", "late") is None
    held.slots.unprove(a)
    held.slots.unprove(a)  # idempotent
    assert held.slots.proven == 1 and not a.proven and a.holder == ""
    assert held.open("10.0.0.3", "late") is not None and held.closed == ["a"]
    held.slots.unprove(a)  # released meanwhile: nothing changes
    assert held.slots.open == 2 and held.slots.proven == 1


def test_proven_connections_leave_newcomers_a_quarter_of_the_slots() -> None:
    """The eighteenth probe: one token's proven connections in every slot but one, and a
    churn of bare connects from a second address turning that slot over faster than a new
    spoke could prove itself (0 of 20). While fewer than a quarter of the slots are
    unproven, a newcomer displaces a proven connection over its share first."""
    held = Held(DoorSlots(16))
    for i in range(16):
        slot = held.open(f"10.4.0.{i}", f"h{i}")
        assert slot is not None
        held.slots.prove(slot, "token hog")
    for i in range(10):  # the churn, from one address
        assert held.open("10.9.9.9", f"c{i}") is not None
    assert held.closed[:4] == ["h0", "h1", "h2", "h3"]  # the hog gave up a quarter
    assert held.slots.open - held.slots.proven == 4
    spoke = held.open("10.0.0.1", "spoke")
    assert spoke is not None
    for i in range(10, 40):  # the churn goes on: it turns over its own
        held.open("10.9.9.9", f"c{i}")
    assert "spoke" not in held.closed and spoke.open


def test_a_holder_over_its_share_gives_up_its_least_recently_used_connection() -> None:
    """The eighteenth probe: another token's newcomers reset a fleet's busy connections (the
    fleet's token over its share lost its oldest, in use or not). The least recently used
    goes first."""
    held = Held(DoorSlots(6))
    fleet = []
    for i in range(5):
        slot = held.open(f"10.5.0.{i}", f"f{i}")
        assert slot is not None
        held.slots.prove(slot, "token fleet")
        fleet.append(slot)
    other = held.open("10.6.0.1", "o1")
    assert other is not None
    held.slots.prove(other, "token other")
    for slot in fleet[:3]:  # f0, f1, f2 busy; f3, f4 idle
        held.slots.used(slot, 100.0)
    held.slots.used(fleet[0], 100.5)  # within the second: not reordered again
    o2 = held.open("10.6.0.2", "o2")
    assert o2 is not None and held.closed == ["f3"]
    held.slots.prove(o2, "token other")
    assert held.open("10.6.0.3", "o3") is not None
    assert held.closed == ["f3", "f4"]  # then f0: used before f1 and f2


def test_who_proved_from_where_is_kept_for_the_turns_not_the_slots() -> None:
    held = Held(DoorSlots(4))
    proven = held.open("10.0.0.9", "spoke-old")
    assert proven is not None
    held.slots.prove(proven, "token a")
    assert held.slots.known.subject("10.0.0.9") == "token a"
    held.open("10.0.0.9", "spoke-new")  # unproven: displaced as any other
    for i in range(3):
        held.open(f"10.1.0.{i}", f"f{i}")
    assert held.closed == ["spoke-new"]


def test_a_token_holders_bare_connects_from_its_known_address_keep_no_newcomer_out() -> None:
    """The twenty-first probe's F1: proving once made an address known, and its bare
    connects then displaced every new spoke's connection before it could prove."""
    held = Held(DoorSlots(64))
    first = held.open("10.0.0.5", "proved")
    assert first is not None
    held.slots.prove(first, "token a")
    held.slots.release(first)  # the proof is remembered after the connection
    newcomers = []
    for i in range(1000):
        held.open("10.0.0.5", f"bare{i}")
        if i % 50 == 0:
            name = f"spoke{i}"
            held.open(f"10.2.0.{i // 50}", name)
            newcomers.append(name)
    assert not set(newcomers) & set(held.closed)
    assert all(name.startswith("bare") for name in held.closed)


def test_an_answered_connection_gives_way_only_after_every_unanswered_one() -> None:
    """A caller that answered the server's first flight (finished its TLS handshake) is
    not displaced by a flood of whole ClientHellos from many addresses while any of the
    flood's connections holds a slot: a restarted hub's fleet was displaced after its
    handshakes, before its first calls proved it (45 of 500 spokes back after 30 s)."""
    held = Held(DoorSlots(8))
    spoke = held.open("10.0.0.9", "spoke")
    assert spoke is not None
    held.slots.answer(spoke)
    for i in range(1000):
        assert held.open(f"10.1.{i // 250}.{i % 250}", f"f{i}") is not None
    assert "spoke" not in held.closed and spoke.open and spoke.answered
    held.slots.prove(spoke, "team-a")  # its call proved it: counted as proven, once
    assert (spoke.proven, spoke.answered) == (True, False)
    assert held.slots.proven == 1 and held.slots.open == 8


def test_answered_connections_beyond_half_the_unproven_give_way_first() -> None:
    """A flood of full handshakes that answered in every slot, then bare connects: the
    answered give way, oldest first, until they are half the unproven; the callers still
    waiting for their turn keep the other half between them, so a newcomer outlives
    three more arrivals, not one (the next bare connect's)."""
    held = Held(DoorSlots(8))
    for i in range(8):
        slot = held.open(f"10.0.0.{i}", f"a{i}")
        assert slot is not None
        held.slots.answer(slot)
    for i in range(4):
        assert held.open(f"10.1.0.{i}", f"bare{i}") is not None
    assert held.closed == ["a0", "a1", "a2", "a3"] and held.slots.answered == 4
    assert held.open("10.2.0.1", "newcomer") is not None
    for i in range(3):
        assert held.open(f"10.3.0.{i}", f"late{i}") is not None
    assert "newcomer" not in held.closed and held.slots.answered == 4
    assert held.closed[-3:] == ["bare1", "bare2", "bare3"]
    assert held.open("10.3.0.9", "late9") is not None
    assert held.closed[-1] == "newcomer"  # the fourth arrival after it: the oldest waiting
    assert [s.who for s in held.slots.unproven("10.0.0.5")] == ["ipv4:10.0.0.5:a5"]


def test_answer_is_idempotent_and_leaves_proven_and_released_slots_alone() -> None:
    slots = DoorSlots(4)
    first = slots.take("10.0.0.1", "ipv4:10.0.0.1:1", lambda: None)
    second = slots.take("10.0.0.1", "ipv4:10.0.0.1:2", lambda: None)
    assert first is not None and second is not None
    slots.answer(first)
    slots.answer(first)
    slots.prove(second, "team-a")
    slots.answer(second)
    assert (first.answered, second.answered) == (True, False) and slots.answered == 1
    slots.release(first)
    slots.answer(first)
    assert slots.unproven("10.0.0.1") == [] and slots.open == 1 and slots.proven == 1
    assert slots.answered == 0
    slots.unprove(second)  # a revoked token's connection is as any that proved nothing
    assert slots.unproven("10.0.0.1") == [second] and not second.answered
