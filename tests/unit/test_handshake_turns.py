"""Whose handshake a door begins next (strata_local/handshakes.py): a token bucket of the
rate, turns by address (a flood's address one turn in a round), known addresses first
but for every fourth turn, and the rate paced by the event loop's lateness (issue 39:
whole-ClientHello floods at the gRPC doors and bulk ports)."""

from __future__ import annotations

import pytest

from strata_local import handshakes
from strata_local.handshakes import HandshakeTurns
from strata_local.knownhosts import KnownHosts


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _turns(rate: float, clock: Clock, known: KnownHosts | None = None) -> HandshakeTurns[str]:
    return HandshakeTurns(rate, known or KnownHosts(clock=clock), clock, least=1.0)


def _due(turns: HandshakeTurns[str], clock: Clock, rounds: int) -> list[str]:
    """What begins over ``rounds`` of 0.11 s (a token each, the bucket holding one)."""
    went = []
    for _ in range(rounds):
        clock.now += 0.11
        went += turns.due()
    return went


def test_below_the_rate_every_handshake_begins_at_once() -> None:
    clock = Clock()
    turns = _turns(100.0, clock)  # a bucket of 10 (0.1 s of the rate)
    assert all(turns.offer(f"10.0.0.{i}", f"c{i}") for i in range(10))
    assert not turns.offer("10.0.0.99", "late")  # the bucket is empty: it waits
    assert turns.waiting == 1 and turns.due() == []
    assert turns.wait_s() == pytest.approx(0.01)
    clock.now += 0.011
    assert turns.due() == ["late"] and turns.waiting == 0 and turns.wait_s() is None
    assert turns.begun == 11 and turns.waited == 1


def test_a_flood_from_one_address_has_one_turn_in_a_round() -> None:
    clock = Clock()
    turns = _turns(10.0, clock)
    assert turns.offer("10.0.0.66", "f0")  # the bucket's one token
    for i in range(1, 500):
        assert not turns.offer("10.0.0.66", f"f{i}")
    assert not turns.offer("10.0.0.7", "spoke")
    assert not turns.offer("10.0.0.8", "other")
    went = _due(turns, clock, 6)
    # the newest addresses first; then the flood's, its oldest first, one turn a round
    assert went == ["other", "spoke", "f1", "f2", "f3", "f4"]
    assert turns.waiting == 495


def test_an_address_that_had_its_turn_goes_behind_the_others() -> None:
    clock = Clock()
    turns = _turns(10.0, clock)
    assert turns.offer("a", "a0")
    for item in ("a1", "a2", "b1", "b2", "c1"):
        assert not turns.offer(item[0], item)
    went = _due(turns, clock, 5)
    assert went == ["c1", "b1", "a1", "b2", "a2"]


def test_known_addresses_go_first_but_every_fourth_turn_is_anothers() -> None:
    clock = Clock()
    known = KnownHosts(clock=clock)
    known.add("10.0.0.7", "token a")
    turns = _turns(10.0, clock, known)
    assert turns.offer("10.0.0.66", "x")
    for i in range(8):
        assert not turns.offer("10.0.0.66", f"flood{i}")
        assert not turns.offer("10.0.0.7", f"spoke{i}")
    went = _due(turns, clock, 8)
    assert went == [
        "spoke0", "spoke1", "spoke2", "flood0", "spoke3", "spoke4", "spoke5", "flood1",
    ]  # fmt: skip


def test_a_flood_over_more_addresses_than_wait_begins_the_newest_first() -> None:
    """Each flood address with one connection waiting: the newest begin while their
    callers still wait; the oldest are those the slots displace."""
    clock = Clock()
    turns = _turns(10.0, clock)
    assert turns.offer("10.1.0.0", "f0")
    for i in range(1, 5):
        assert not turns.offer(f"10.1.0.{i}", f"f{i}")
    assert not turns.offer("10.0.0.7", "spoke")
    clock.now += 0.11
    assert turns.due() == ["spoke"]
    went = []
    for i in range(5, 8):
        assert not turns.offer(f"10.1.0.{i}", f"f{i}")  # the flood goes on arriving
        clock.now += 0.11
        went += turns.due()
    assert went == ["f5", "f6", "f7"] and turns.waiting == 4


def test_a_subjects_known_addresses_share_one_turn_in_a_round() -> None:
    """The twenty-first probe's F3: one token proved 4,000 addresses, then flooded from
    them, a turn each, and the returning spokes of other tokens waited behind."""
    clock = Clock()
    known = KnownHosts(clock=clock)
    for i in range(100):
        known.add(f"10.7.0.{i}", "token x")
    known.add("10.0.0.7", "token a")
    known.add("10.0.0.8", "token b")
    turns = _turns(10.0, clock, known)
    assert turns.offer("10.7.0.0", "x0")
    for i in range(1, 100):
        assert not turns.offer(f"10.7.0.{i}", f"x{i}")
    assert not turns.offer("10.0.0.7", "a")
    assert not turns.offer("10.0.0.8", "b")
    went = _due(turns, clock, 5)
    # token x's 99 addresses: one turn a round, round their networks (the newest address of
    # their one /24, x99) and by address (the newest not yet begun, x98) in turn
    assert went == ["b", "a", "x99", "x98", "x97"]
    turns.withdraw("x50")
    assert turns.waiting == 95


def test_a_withdrawn_item_never_has_a_turn() -> None:
    clock = Clock()
    turns = _turns(10.0, clock)
    assert turns.offer("a", "a0")
    assert not turns.offer("a", "a1")
    assert not turns.offer("b", "b1")
    turns.withdraw("b1")
    turns.withdraw("b1")  # idempotent
    turns.withdraw("never offered")
    assert turns.waiting == 1
    clock.now += 0.11
    assert turns.due() == ["a1"] and turns.waiting == 0 and turns.wait_s() is None


def test_lateness_twice_in_a_row_cuts_the_rate_once_a_hold() -> None:
    clock = Clock()
    turns = _turns(4000.0, clock)
    pace = handshakes.PACE_S
    offered = iter(range(1 << 20))  # each connection offered once

    def begin(n: int) -> None:
        for i in range(n):
            turns.offer(f"h{i}", f"c{next(offered)}")
        clock.now += pace
        turns.due()

    begin(400)  # the bucket's 400 at once
    turns.pace(late_s=0.05)  # one late timer: a pause, not a load
    assert turns.rate == 4000.0
    begin(200)
    turns.pace(late_s=0.05)  # late again: 0.7 of the 2,000 a second begun
    assert turns.rate == pytest.approx(2000.0 * handshakes.BACK_OFF)
    begin(100)
    turns.pace(late_s=0.05)  # within the hold: no second cut yet
    assert turns.rate == pytest.approx(2000.0 * handshakes.BACK_OFF)
    clock.now += handshakes.HOLD_S
    turns.pace(late_s=0.05)  # late, but nothing begun: not the handshakes' doing
    assert turns.rate == pytest.approx(2000.0 * handshakes.BACK_OFF)
    for _ in range(200):  # late and late again: never below the least
        begin(5)
        turns.pace(late_s=1.0)
    assert turns.rate == 1.0


def test_a_few_handshakes_in_a_late_loop_do_not_cut_the_rate() -> None:
    """The twenty-first probe: one handshake begun in a late interval took the rate from
    4,000 to its floor."""
    clock = Clock()
    turns: HandshakeTurns[str] = HandshakeTurns(4000.0, KnownHosts(clock=clock), clock, least=100.0)
    for _ in range(20):
        turns.offer("10.0.0.7", "one")
        clock.now += handshakes.PACE_S
        turns.pace(late_s=0.5)  # 10 a second begun: below the least
    assert turns.rate == 4000.0


def test_on_time_the_rate_rises_to_its_most() -> None:
    clock = Clock()
    turns = _turns(100.0, clock)
    turns.rate = 10.0
    clock.now += handshakes.PACE_S
    turns.pace(late_s=handshakes.LATE_S)  # late, if not twice: no reason to rise
    assert turns.rate == 10.0
    clock.now += handshakes.PACE_S
    turns.pace(late_s=0.0)
    assert turns.rate == pytest.approx(10.0 * handshakes.SPEED_UP)
    for _ in range(100):
        clock.now += handshakes.PACE_S
        turns.pace(late_s=0.0)  # rising, to at most 100
    assert turns.rate == 100.0


def test_a_rate_that_is_not_positive_is_refused() -> None:
    with pytest.raises(ValueError, match="must be positive"):
        HandshakeTurns(0.0)


def test_known_hosts_expire_and_are_bounded() -> None:
    clock = Clock()
    known = KnownHosts(most=2, keep_s=60.0, clock=clock)
    known.add("a", "token 1")
    known.add("b", "token 1")
    known.add("a", "token 2")  # proved again: the newest, and by another token
    known.add("c", "token 1")  # the least recently proven, b, is forgotten
    assert "a" in known and "c" in known and "b" not in known and len(known) == 2
    assert known.subject("a") == "token 2" and known.subject("b") is None
    clock.now += 61
    assert "a" not in known and 7 not in known


def test_a_flood_from_one_ipv6_host_cannot_outnumber_a_new_caller() -> None:
    """A host routed a /64 floods from a new address each connection (issue 39's older
    MEDIUM: by address, each arrival was as new as the new spoke, and took its turn); round
    the networks, a caller from another network is in the next round."""
    clock = Clock()
    turns = _turns(10.0, clock)
    assert turns.offer("2001:db8:66::1", "f0")
    arrivals = iter(range(1, 1 << 20))

    def flood(n: int) -> None:
        for _ in range(n):
            i = next(arrivals)
            assert not turns.offer(f"2001:db8:66::{i:x}", f"f{i}")

    flood(100)
    assert not turns.offer("2001:db8:7::7", "spoke")  # another customer's /48
    flood(100)  # the flood goes on arriving, each from a new address
    went = _due(turns, clock, 1)
    flood(50)
    went += _due(turns, clock, 1)
    assert "spoke" in went


def test_a_flood_over_many_ipv4_networks_of_one_provider_cannot_outnumber_a_new_caller() -> None:
    clock = Clock()
    turns = _turns(10.0, clock)

    def flood(i: int) -> bool:  # 250 addresses a /24, eight /24s at a time, of one /16
        return turns.offer(f"198.51.{i % 8 + 8 * (i // 2000)}.{i // 8 % 250 + 1}", f"f{i}")

    assert flood(0)
    assert not any(flood(i) for i in range(1, 2000))
    assert not turns.offer("203.0.113.7", "spoke")
    assert not any(flood(i) for i in range(2000, 2100))  # new addresses, newer than the spoke
    went = _due(turns, clock, 2)
    assert "spoke" in went


def test_every_other_turn_of_the_unknown_goes_by_address() -> None:
    """A fresh fleet in one network against a flood with as many networks as connections:
    round the networks the fleet has one turn a round, but every other turn goes by
    address, the newest first, as before the networks counted."""
    clock = Clock()
    turns = _turns(10.0, clock)
    assert turns.offer("10.0.0.1", "fleet0")
    for i in range(1, 4):
        assert not turns.offer(f"10.0.0.{i + 1}", f"fleet{i}")  # one /24 of a cluster
    for i in range(4):
        assert not turns.offer(f"{100 + i}.0.0.1", f"flood{i}")  # a network each, newer
    went = _due(turns, clock, 4)
    # round the networks: the newest network (flood3); by address: the newest address not
    # yet begun (flood2); round the networks: flood1; by address: flood0
    assert went == ["flood3", "flood2", "flood1", "flood0"]
    for i in range(4, 8):
        assert not turns.offer(f"{100 + i}.0.0.1", f"flood{i}")
    assert not turns.offer("10.0.0.9", "fleet9")  # a spoke of the fleet, the newest address
    went = _due(turns, clock, 4)
    # networks: the newest network (flood7); by address: the fleet's newest spoke, though
    # its network is behind four of the flood's; networks: flood6; by address: flood5
    assert went == ["flood7", "fleet9", "flood6", "flood5"]
    assert turns.waiting == 4  # flood4 and the fleet's three first


def test_inside_one_tokens_turn_its_networks_take_turns() -> None:
    """Issue 39's N2: a holder of the fleet's token proved many addresses of its own /64
    and flooded from them; inside the token's turn they came first, oldest first, and the
    fleet's spokes returning to a restarted hub waited behind every one."""
    clock = Clock()
    known = KnownHosts(clock=clock)
    for i in range(1, 201):
        known.add(f"2001:db8:66::{i:x}", "fleet token")
    for i in range(1, 4):
        known.add(f"10.0.0.{i}", "fleet token")
    turns = _turns(10.0, clock, known)
    assert turns.offer("2001:db8:66::1", "f1")
    for i in range(2, 201):
        assert not turns.offer(f"2001:db8:66::{i:x}", f"f{i}")
    for i in range(1, 4):
        assert not turns.offer(f"10.0.0.{i}", f"spoke{i}")
    went = _due(turns, clock, 12)
    # round the token's networks (the spokes' /16 the newest) and by address (the spokes'
    # the newest), in turn: the spokes among the first four, not after the flood's 199
    # (oldest first, as before the networks counted)
    assert went[:5] == ["spoke3", "spoke2", "f200", "spoke1", "f199"]


def test_known_addresses_whose_turns_bought_no_proof_go_behind_those_whose_did() -> None:
    """The thirty-sixth probe: a holder of the fleet's token proved 4,000 addresses over
    200 /24s of the fleet's own /16 and flooded from them; round the networks, the
    fleet's two /24s had two turns in 202."""
    clock = Clock()
    known = KnownHosts(clock=clock)
    flood = [f"10.8.{2 + i % 200}.{i // 200 + 1}" for i in range(400)]
    for host in flood:
        known.add(host, "fleet token")
    for i in range(4):
        known.add(f"10.8.0.{i + 1}", "fleet token")
    turns = _turns(10.0, clock, known)
    assert turns.offer(flood[0], "first")
    for n, host in enumerate(flood):  # each flood address has one connection waiting
        assert not turns.offer(host, f"f{n}")
    went = _due(turns, clock, 400)  # their turns, and spent: none of them proved
    assert len(went) == 400 and known.standing(flood[0]) == ("fleet token", 2)
    assert known.standing(flood[1]) == ("fleet token", 1)
    for n, host in enumerate(flood):  # the flood goes on, from the same addresses
        assert not turns.offer(host, f"again{n}")
    for i in range(4):  # the fleet's spokes return
        assert not turns.offer(f"10.8.0.{i + 1}", f"spoke{i}")
    assert sorted(_due(turns, clock, 4)) == ["spoke0", "spoke1", "spoke2", "spoke3"]
    known.add("10.8.0.1", "fleet token", credit=2)  # a spoke's first call proves it
    assert known.standing("10.8.0.1") == ("fleet token", 0)
    assert known.standing("10.8.0.2") == ("fleet token", 1)
    known.add(flood[5], "fleet token", credit=2)  # the holder proves from a flood address
    assert known.standing(flood[5]) == ("fleet token", 0)  # its one turn and one more off:
    turns.offer(flood[5], "paid")  # in the first rank again, for one connection's turn
    turns.offer(flood[6], "unpaid")
    assert _due(turns, clock, 1) == ["paid"] and known.standing(flood[5]) == ("fleet token", 1)
    turns.withdraw("again7")
    assert turns.waiting == 400
