"""Known callers (strata_local/knownhosts.py): who proved a credential from which address,
forgotten after the hour and beyond the most kept, and carried across a restart in a file
the server writes whole — a restarted hub knew nobody, so a fleet returning under a flood
from new addresses waited its turn behind the flood (issue 39's twenty-first probe, F2)."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path

import pytest

from strata_local.knownhosts import LOAD_MOST_BYTES, NAME_MOST, KnownHosts


class Clock:
    """A settable clock (seconds)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _known(
    mono: float = 1000.0, wall: float = 1.7e9, most: int = 8, subject_most: int = 8
) -> tuple[KnownHosts, Clock, Clock]:
    clock, wall_clock = Clock(mono), Clock(wall)
    known = KnownHosts(
        most=most, subject_most=subject_most, keep_s=3600.0, clock=clock, wall=wall_clock
    )
    return known, clock, wall_clock


def test_an_address_is_known_for_the_hour_after_it_last_proved() -> None:
    known, clock, _ = _known()
    known.add("10.0.0.7", "team-a")
    clock.now += 3599
    assert known.subject("10.0.0.7") == "team-a"
    known.add("10.0.0.7", "team-a")  # proved again: an hour from now
    clock.now += 3599
    assert "10.0.0.7" in known
    clock.now += 2
    assert known.subject("10.0.0.7") is None and len(known) == 0


def test_turns_spent_unproven_are_counted_until_the_address_proves_again() -> None:
    known, clock, _ = _known(most=2)
    known.spend("10.0.0.9")  # not known: nothing to count
    assert known.standing("10.0.0.9") is None
    known.add("10.0.0.7", "team-a")
    assert known.standing("10.0.0.7") == ("team-a", 0)
    known.spend("10.0.0.7")
    known.spend("10.0.0.7")
    assert known.standing("10.0.0.7") == ("team-a", 2)
    known.add("10.0.0.7", "team-a")  # a proven connection still in use: no credit
    assert known.standing("10.0.0.7") == ("team-a", 2)
    known.spend("10.0.0.7")
    known.add("10.0.0.7", "team-b", credit=2)  # a connection's first proof, another token's
    assert known.standing("10.0.0.7") == ("team-b", 1)  # the count kept
    known.add("10.0.0.7", "team-a", credit=2)
    assert known.standing("10.0.0.7") == ("team-a", 0)
    known.spend("10.0.0.7")
    known.add("10.0.0.8", "team-b")
    known.add("10.0.0.6", "team-b")  # past the most: 10.0.0.7 forgotten, its count too
    assert known.standing("10.0.0.7") is None
    known.add("10.0.0.7", "team-a")
    assert known.standing("10.0.0.7") == ("team-a", 0)
    known.spend("10.0.0.7")
    clock.now += 3601  # past the hour: forgotten with its count
    assert known.standing("10.0.0.7") is None


def test_the_count_forgets_what_is_past_the_hour_without_a_look_up() -> None:
    """``len`` (``strata_hub_known_callers``) counts no departed fleet."""
    known, clock, _ = _known()
    known.add("10.0.0.1", "a")
    known.add("10.0.0.2", "a")
    clock.now += 1800
    known.add("10.0.0.3", "b")
    known.add("10.0.0.1", "a")  # proved again: the newest
    clock.now += 1801
    assert len(known) == 2  # 10.0.0.2 only was past its hour
    clock.now += 1800
    assert len(known) == 0


def test_the_least_recently_proven_are_forgotten_beyond_the_most() -> None:
    known, _, _ = _known(most=2)
    for host in ("10.0.0.1", "10.0.0.2", "10.0.0.3"):
        known.add(host, "s")
    assert "10.0.0.1" not in known
    assert "10.0.0.2" in known and "10.0.0.3" in known and len(known) == 2


def test_one_subject_keeps_its_most_recently_proven_addresses_and_no_other_subjects_go() -> None:
    """One token's holder proving from many addresses makes at most ``subject_most`` of
    them known (each a known turn after a restart: the thirty-fourth probe's N2), and
    forgets its own least recent first, never another subject's."""
    known, _, _ = _known(most=8, subject_most=3)
    known.add("10.0.0.1", "fleet")
    known.add("10.0.0.2", "fleet")
    for i in range(6):
        known.add(f"10.9.0.{i}", "holder")
    assert [f"10.9.0.{i}" in known for i in range(6)] == [False] * 3 + [True] * 3
    assert known.subject("10.0.0.1") == known.subject("10.0.0.2") == "fleet"
    known.add("10.0.0.3", "fleet")
    known.add("10.0.0.1", "fleet")  # proved again: the fleet's newest, .2 its oldest
    known.add("10.0.0.4", "fleet")
    assert "10.0.0.2" not in known and len(known) == 6
    known.add("10.9.0.5", "fleet")  # the address proved another subject now: counted there
    assert known.subject("10.9.0.5") == "fleet" and "10.0.0.3" not in known
    assert "10.9.0.3" in known and "10.9.0.4" in known and len(known) == 5


def test_a_file_holding_many_of_one_subjects_addresses_loads_its_most_recent(
    tmp_path: Path,
) -> None:
    path = tmp_path / "known-callers.json"
    first, clock, wall = _known(most=64, subject_most=64)
    for i in range(20):
        first.add(f"10.9.0.{i}", "fleet")
        clock.now += 1
        wall.now += 1
    first.add("10.0.0.1", "team-b")
    assert first.save(path) == 21
    second, _, _ = _known(wall=wall.now, most=64, subject_most=4)
    assert second.load(path) == 21  # read, then the least recent of each subject forgotten
    assert len(second) == 5 and "10.0.0.1" in second
    assert [f"10.9.0.{i}" in second for i in range(20)] == [False] * 16 + [True] * 4


def test_what_was_saved_is_known_after_a_restart_for_what_is_left_of_its_hour(
    tmp_path: Path,
) -> None:
    path = tmp_path / "known-callers.json"
    first, clock, wall = _known()
    first.add("10.0.0.1", "team-a")
    clock.now += 600
    wall.now += 600
    first.add("2001:db8::7", "team-b")
    clock.now += 2000
    wall.now += 2000
    first.add("10.0.0.3", "team-a")
    clock.now += 1100  # 10.0.0.1 proved 3,700 s ago: no longer known
    wall.now += 1100
    assert first.save(path) == 2
    assert stat.S_IMODE(path.stat().st_mode) == 0o600

    wall.now += 30  # the restart: a new process, its monotonic clock anywhere
    restarted = Clock(5.0)
    second = KnownHosts(keep_s=3600.0, clock=restarted, wall=wall)
    assert second.load(path) == 2
    assert second.subject("2001:db8::7") == "team-b"
    assert second.subject("10.0.0.3") == "team-a"
    assert "10.0.0.1" not in second
    restarted.now += 471  # 2001:db8::7 proved 3,130 s before the restart
    assert "2001:db8::7" not in second and "10.0.0.3" in second
    later = KnownHosts(keep_s=3600.0, clock=Clock(5.0), wall=Clock(wall.now + 500))
    assert later.load(path) == 1  # 2001:db8::7 proved 3,630 s before: gone
    assert "10.0.0.3" in later


def test_a_file_from_the_future_counts_as_proven_now(tmp_path: Path) -> None:
    """The wall clock behind the one that wrote the file (a restored VM, a lagging
    node): its entries are believed, as proven now, not dropped (the twenty-second probe:
    a clock 61 s behind made the whole fleet new again)."""
    path = tmp_path / "known.json"
    entries = [["10.0.0.1", "a", 1.7e9 + 30], ["10.0.0.2", "b", 1.7e9 + 600]]
    path.write_text(json.dumps({"format": 1, "hosts": entries}))
    known, clock, _ = _known(wall=1.7e9)
    assert known.load(path) == 2
    clock.now += 3600
    assert "10.0.0.1" in known and "10.0.0.2" in known
    clock.now += 1
    assert "10.0.0.1" not in known and "10.0.0.2" not in known  # an hour from the load
    assert len(known) == 0


def test_a_missing_file_adds_nobody(tmp_path: Path) -> None:
    known, _, _ = _known()
    assert known.load(tmp_path / "none.json") == 0 and len(known) == 0


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        b"\xff\xfe".decode("latin-1"),
        "[]",
        '{"format": 2, "hosts": []}',
        '{"format": 1, "hosts": {}}',
        '{"format": 1, "hosts": [["10.0.0.1", "a"]]}',
        '{"format": 1, "hosts": [["10.0.0.1", "a", "yesterday"]]}',
        '{"format": 1, "hosts": [["10.0.0.1", 7, 1700000000]]}',
        '{"format": 1, "hosts": [["10.0.0.1", "a", true]]}',
        '{"format": 1, "hosts": [["", "a", 1700000000]]}',
        '{"format": 1, "hosts": [["10.0.0.1", "%s", 1700000000]]}' % ("s" * (NAME_MOST + 1)),
    ],
)
def test_a_file_that_is_not_one_is_reported_and_adds_nobody(
    tmp_path: Path, text: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "known.json"
    path.write_text(text, encoding="latin-1")
    known, _, _ = _known()
    assert known.load(path) == 0 and len(known) == 0
    assert "known callers not read from" in caplog.text


def test_a_file_larger_than_any_saved_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "known.json"
    padding = " " * (LOAD_MOST_BYTES + 1)
    path.write_text('{"format": 1, "hosts": [["10.0.0.1", "a", 1700000000]]}' + padding)
    known, _, _ = _known()
    assert known.load(path) == 0


def test_an_unreadable_path_adds_nobody(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    known, _, _ = _known()
    assert known.load(tmp_path) == 0  # a directory
    assert "known callers not read from" in caplog.text


def test_a_fifo_or_a_link_is_not_waited_on_or_followed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A FIFO where the file goes blocked the hub's start forever; a link is not
    followed (the file is the data directory's own)."""
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    real = tmp_path / "real.json"
    real.write_text(json.dumps({"format": 1, "hosts": [["10.0.0.1", "a", 1.7e9]]}))
    link = tmp_path / "link.json"
    link.symlink_to(real)
    known, _, _ = _known(wall=1.7e9)
    assert known.load(fifo) == 0  # returns at once: not a regular file
    assert known.load(link) == 0
    assert known.load(real) == 1
    assert caplog.text.count("known callers not read from") == 2


def test_a_save_that_fails_raises_and_leaves_nothing_behind(tmp_path: Path) -> None:
    path = tmp_path / "known.json"
    path.mkdir()
    (path / "x").write_text("in the way")  # a directory where the file goes: not replaced
    known, _, _ = _known()
    known.add("10.0.0.1", "a")
    with pytest.raises(OSError):
        known.save(path)
    assert sorted(os.listdir(tmp_path)) == ["known.json"]  # no temporary file left


def test_a_cancelled_saver_lets_its_write_finish_first(tmp_path: Path) -> None:
    """The saver cancelled during a write (the hub stopping) returns only once the
    write is done, so the final save after it is the file's last word."""
    path = tmp_path / "known.json"
    known, _, _ = _known()

    async def go() -> list[list[object]]:
        task = asyncio.create_task(known.save_every(path, every_s=0.01))
        known.add("10.0.0.1", "early")
        for _ in range(500):
            await asyncio.sleep(0.001)
            if path.exists():
                break
        known.add("10.0.0.2", "late")
        await asyncio.sleep(0.02)  # the next write is likely under way: cancel it
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        known.save(path)
        hosts: list[list[object]] = json.loads(path.read_text())["hosts"]
        return hosts

    hosts = asyncio.run(go())
    assert [entry[:2] for entry in hosts] == [["10.0.0.1", "early"], ["10.0.0.2", "late"]]
    assert sorted(os.listdir(tmp_path)) == ["known.json"]


def test_save_every_writes_only_after_a_change(tmp_path: Path) -> None:
    path = tmp_path / "known.json"
    known, _, _ = _known()

    async def go() -> tuple[bool, list[list[object]]]:
        task = asyncio.create_task(known.save_every(path, every_s=0.01))
        await asyncio.sleep(0.05)
        written_unchanged = path.exists()
        known.add("10.0.0.9", "team-c")
        for _ in range(500):
            await asyncio.sleep(0.01)
            if path.exists():
                break
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        hosts: list[list[object]] = json.loads(path.read_text())["hosts"]
        return written_unchanged, hosts

    written_unchanged, hosts = asyncio.run(go())
    assert not written_unchanged
    assert [entry[:2] for entry in hosts] == [["10.0.0.9", "team-c"]]
