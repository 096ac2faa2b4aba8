"""A block's life (spoke.fetch.life) as a state machine on its own: every transition, the
reads it meets in every state (the interleavings earlier fixes patched one at a time),
what its subscribers hear, and the counts returning to zero."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from spoke.cache.admission import Placement
from spoke.errors import HubUnavailable
from spoke.fetch.ledger import PrefetchLedger
from spoke.fetch.life import BlockLives
from spoke.fetch.lifestate import NEXT, Event, InvalidTransition, Life, State
from spoke.fetch.priority import Priority, Source

SIZE = 4096


class Heard:
    """A subscriber that keeps what it heard, and a real ledger subscribed beside it."""

    def __init__(self, lives: BlockLives) -> None:
        self.events: list[tuple[Event, str]] = []
        self.ledger = PrefetchLedger()
        lives.subscribe(lambda event, life: self.events.append((event, life.digest)))
        lives.subscribe(self.ledger.hear)

    def names(self) -> list[str]:
        return [event.name for event, _ in self.events]


def _run(body: Callable[[BlockLives, Heard], None]) -> None:
    async def go() -> None:
        lives = BlockLives()
        body(lives, Heard(lives))

    asyncio.run(go())


def _zero(lives: BlockLives) -> None:
    assert len(lives) == 0
    assert lives.on_the_way_bytes == lives.wire_bytes == lives.admitting_bytes == 0
    assert lives.speculative_bytes == 0
    assert all(lives.queued(p) == (0, 0) for p in Priority)


def _to_verified(lives: BlockLives, digest: str = "a") -> Life:
    lives.take(Priority.READAHEAD, SIZE, 1)
    life = lives.arrived(digest)
    assert life is not None and life.state is State.VERIFIED
    return life


def test_a_prefetch_read_after_it_is_resident_is_issued_then_used() -> None:
    def body(lives: BlockLives, heard: Heard) -> None:
        life, new = lives.want("a", SIZE, Priority.READAHEAD, Source.READAHEAD)
        assert new and lives.queued(Priority.READAHEAD) == (1, SIZE)
        assert lives.take(Priority.READAHEAD, SIZE, 8) == [life]
        assert lives.wire_bytes == SIZE
        assert lives.arrived("a") is life and lives.admitting_bytes == SIZE
        assert life.placement() is Placement.AHEAD
        lives.admitted(life)
        assert life.future.result() is None
        assert life.state is State.RESIDENT and lives.is_unread("a")
        _zero(lives)
        ledger = heard.ledger[Source.READAHEAD]
        assert ledger.issued == SIZE and ledger.used == 0 and ledger.outstanding == SIZE
        assert lives.read("a") is True  # its first read
        assert life.state is State.DONE and not lives.is_unread("a")
        assert lives.read("a") is False  # a second read is the policy's alone
        assert ledger.used == SIZE and ledger.outstanding == 0
        assert heard.names() == ["WANTED", "SENT", "ARRIVED", "RESIDENT", "READ"]

    _run(body)


def test_a_hit_while_its_admission_runs_reaches_the_ledger_and_the_policy() -> None:
    """The block file landed and the mount read it; the policy's insert is still to run:
    the read is kept on the life (unseen) and heard with RESIDENT."""

    def body(lives: BlockLives, heard: Heard) -> None:
        life, _ = lives.want("a", SIZE, Priority.READAHEAD, Source.CROSSFILE)
        _to_verified(lives)
        assert life.placement() is Placement.AHEAD
        assert lives.read("a") is False  # a hit during admission
        assert life.read and life.unseen
        lives.admitted(life)
        assert life.state is State.DONE and not lives.is_unread("a")
        ledger = heard.ledger[Source.CROSSFILE]
        assert ledger.issued == ledger.used == SIZE and ledger.outstanding == 0
        _zero(lives)

    _run(body)


def test_a_miss_joining_a_fetch_already_placed_ahead_is_a_read() -> None:
    def body(lives: BlockLives, heard: Heard) -> None:
        life, _ = lives.want("a", SIZE, Priority.READAHEAD, Source.CROSSFILE)
        _to_verified(lives)
        assert life.placement() is Placement.AHEAD  # chosen once: stays
        again, new = lives.want("a", SIZE, Priority.DEMAND, None)
        assert again is life and not new
        lives.read("a", joined=True)
        assert life.read and life.unseen and life.placement() is Placement.AHEAD
        lives.admitted(life)
        assert heard.ledger[Source.CROSSFILE].used == SIZE
        assert not lives.is_unread("a")
        _zero(lives)

    _run(body)


def test_a_reader_joining_a_queued_prefetch_claims_it() -> None:
    def body(lives: BlockLives, heard: Heard) -> None:
        heard.ledger[Source.READAHEAD].shrink(SIZE)  # below its largest: room to grow
        life, _ = lives.want("a", SIZE, Priority.READAHEAD, Source.READAHEAD)
        window = heard.ledger[Source.READAHEAD].window
        lives.want("a", SIZE, Priority.DEMAND, None)
        lives.read("a", joined=True)
        assert life.claimed and life.prefetch is None and life.priority is Priority.DEMAND
        assert lives.queued(Priority.DEMAND) == (1, SIZE)
        assert lives.queued(Priority.READAHEAD) == (0, 0)
        ledger = heard.ledger[Source.READAHEAD]
        assert ledger.outstanding == 0 and ledger.window == window + SIZE
        lives.take(Priority.DEMAND, SIZE, 1)
        lives.arrived("a")
        assert life.placement() is Placement.DEMAND
        lives.admitted(life)
        assert ledger.issued == 0  # the reader's fetch, not the source's
        assert heard.names() == ["WANTED", "CLAIMED", "SENT", "ARRIVED", "RESIDENT"]
        _zero(lives)

    _run(body)


@pytest.mark.parametrize("state", [State.WANTED, State.WIRE])
def test_a_hit_for_a_block_not_arrived_is_a_stale_file_and_marks_nothing(state: State) -> None:
    def body(lives: BlockLives, heard: Heard) -> None:
        life, _ = lives.want("a", SIZE, Priority.READAHEAD, Source.READAHEAD)
        if state is State.WIRE:
            lives.take(Priority.READAHEAD, SIZE, 1)
        assert lives.read("a") is False
        assert not life.read and not life.claimed and not life.unseen
        lives.take(Priority.READAHEAD, SIZE, 1)
        lives.arrived("a")
        lives.admitted(life)
        assert lives.is_unread("a")

    _run(body)


def test_a_failure_while_readers_wait_reaches_every_reader_and_frees_its_bytes() -> None:
    def body(lives: BlockLives, heard: Heard) -> None:
        life, _ = lives.want("a", SIZE, Priority.READAHEAD, Source.READAHEAD)
        lives.want("a", SIZE, Priority.READAHEAD, None)  # a second asker joins
        lives.take(Priority.READAHEAD, SIZE, 1)
        lives.read("a", joined=True)
        error = HubUnavailable("down")
        lives.fail("a", error)
        assert life.state is State.FAILED and life.future.exception() is error
        assert "a" not in lives
        ledger = heard.ledger[Source.READAHEAD]
        assert ledger.outstanding == 0 and ledger.issued == 0
        assert heard.names()[-1] == "FAILED"
        lives.fail("a", error)  # a second failure of a life gone: nothing
        assert heard.names().count("FAILED") == 1
        _zero(lives)

    _run(body)


def test_an_unread_prefetch_evicted_is_wasted_and_its_source_shrinks() -> None:
    def body(lives: BlockLives, heard: Heard) -> None:
        ledger = heard.ledger[Source.FILL]
        window = ledger.window
        life, _ = lives.want("a", SIZE, Priority.FILL, Source.FILL)
        lives.take(Priority.FILL, SIZE, 1)
        lives.arrived("a")
        lives.admitted(life)
        lives.evicted("a", SIZE)
        assert life.state is State.EVICTED and not lives.is_unread("a")
        assert ledger.wasted == SIZE and ledger.window == window // 2
        assert lives.read("a") is False  # read after its eviction: a miss, not a use
        lives.evicted("a", SIZE)  # a second eviction of the digest: nothing
        assert heard.names()[-1] == "EVICTED" and heard.names().count("EVICTED") == 1

    _run(body)


def test_a_block_not_kept_is_streamed_to_its_readers_and_counted_by_whether_read() -> None:
    def body(lives: BlockLives, heard: Heard) -> None:
        read, _ = lives.want("a", SIZE, Priority.READAHEAD, Source.READAHEAD)
        unread, _ = lives.want("b", SIZE, Priority.READAHEAD, Source.READAHEAD)
        lives.take(Priority.READAHEAD, 2 * SIZE, 2)
        lives.read("a", joined=True)
        for life in (read, unread):
            lives.arrived(life.digest)
            lives.streamed(life, b"x" * SIZE)
            assert life.state is State.STREAMED and life.future.result() == b"x" * SIZE
        ledger = heard.ledger[Source.READAHEAD]
        assert ledger.issued == 2 * SIZE and ledger.used == SIZE and ledger.wasted == SIZE
        _zero(lives)

    _run(body)


def test_a_batch_cancelled_before_its_block_arrived_leaves_it_off_the_wire() -> None:
    def body(lives: BlockLives, heard: Heard) -> None:
        life, _ = lives.want("a", SIZE, Priority.DEMAND, None)
        lives.take(Priority.DEMAND, SIZE, 1)
        lives.left(life)
        assert life.state is State.LEFT and lives.wire_bytes == 0
        assert lives.arrived("a") is None  # not on the wire: nobody waits for it here
        assert lives.close() == [life] and life.state is State.FAILED
        _zero(lives)

    _run(body)


def test_only_the_transitions_the_machine_names_are_allowed() -> None:
    def body(lives: BlockLives, heard: Heard) -> None:
        life, _ = lives.want("a", SIZE, Priority.DEMAND, None)
        with pytest.raises(InvalidTransition):
            lives.admitted(life)  # WANTED -> resident: it never arrived
        with pytest.raises(InvalidTransition):
            lives.streamed(life, b"")
        assert life.state is State.WANTED and lives.on_the_way_bytes == SIZE
        lives.take(Priority.DEMAND, SIZE, 1)
        lives.arrived("a")
        lives.admitted(life)
        with pytest.raises(InvalidTransition):
            lives.admitted(life)  # twice
        _zero(lives)

    _run(body)
    assert set(NEXT) == {State.WANTED, State.WIRE, State.VERIFIED, State.LEFT, State.RESIDENT}
    terminal = {State.STREAMED, State.FAILED, State.EVICTED, State.DONE}
    assert all(not (NEXT.get(state)) for state in terminal)


@pytest.mark.parametrize(
    ("when", "joined"),
    [
        (State.WANTED, True),
        (State.WIRE, True),
        (State.VERIFIED, True),
        (State.VERIFIED, False),
        (State.RESIDENT, False),
    ],
)
def test_every_read_of_a_prefetch_counts_it_used_once_whenever_it_comes(
    when: State, joined: bool
) -> None:
    """A reader at each state a prefetch goes through: the prefetch counts used exactly
    once (or claimed, before it left), and nothing stays cached unread."""

    def body(lives: BlockLives, heard: Heard) -> None:
        life, _ = lives.want("a", SIZE, Priority.HINT, Source.HINT)
        steps = [State.WANTED, State.WIRE, State.VERIFIED, State.RESIDENT]
        for state in steps:
            if state is State.WIRE:
                lives.take(Priority.HINT, SIZE, 1)
            elif state is State.VERIFIED:
                lives.arrived("a")
                life.placement()
            elif state is State.RESIDENT:
                lives.admitted(life)
            if state is when:
                lives.read("a", joined=joined)
        ledger = heard.ledger[Source.HINT]
        assert not lives.is_unread("a") and life.state is State.DONE
        if when is State.WANTED:
            assert ledger.issued == 0 and ledger.used == 0  # claimed: the reader's
        else:
            assert ledger.issued == ledger.used == SIZE
        assert ledger.outstanding == 0 and ledger.wasted == 0
        assert life.unseen == (when is State.VERIFIED)
        _zero(lives)

    _run(body)
