"""Clients that never read their answers, against the admin API's server: a security probe
held every connection of a spoke's admin port (and of its ``--metrics`` port, the kubelet's
probes then all failing) with pipelined ``GET /healthz`` it never read, each connection with
a 4 KiB receive buffer. Such a connection is aborted once it has taken nothing for the
write-stall timeout, a connection arriving at the cap displaces one sooner, and a client
reading slowly but steadily, or waiting on its answer, is kept. A later probe held them all
with slow readers, each taking 2 KiB every 0.6 s of pipelined answers: a connection arriving
at the cap displaces the one that has owed the longest (taking a little does not end
owing), and one taking its answers below the rate floor is aborted after the write-stall
timeout."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from spoke.serve.adminserver import REQUEST_TIMEOUT_S, WRITE_STALL_S
from tests.integration.admin_stall_support import (
    ANSWERED,
    BIG,
    CLOSED,
    RCVBUF,
    SlowReaders,
    Stalled,
    closed,
    get,
    serving,
)
from tests.integration.connflood_support import ConnectionFlood, kubelet, longest_failing_run
from tests.integration.mesh_support import Region, Spoke, wait_until
from tests.support import publish

pytestmark = pytest.mark.timeout(300)

OK = b"HTTP/1.1 200 OK"
REASONS = ("stalled", "displaced", "timeout", "limit", "slow")


def _counts() -> dict[str, float]:
    return {r: closed(r) for r in REASONS}


def _delta(before: dict[str, float]) -> dict[str, float]:
    return {r: closed(r) - before[r] for r in REASONS}


def test_unread_pipelined_answers_are_aborted_after_the_write_stall() -> None:
    before = _counts()
    with serving(max_connections=64, write_stall_s=2.0) as (host, port):
        stalled = Stalled(host, port, 8)
        try:
            stalled.pump()
            wait_until(lambda: stalled.open() == 0, "stalled readers aborted", 2.0 + 20)
            assert _delta(before) == {
                "stalled": 8,
                "displaced": 0,
                "timeout": 0,
                "limit": 0,
                "slow": 0,
            }
            assert get(host, port, "/healthz").startswith(OK)
        finally:
            stalled.close()


def test_an_unread_large_answer_is_aborted_and_freed() -> None:
    """A 4 MiB answer unread: uvicorn wrote it whole and its keep-alive timeout closed the
    connection, which then held it until the client read it; now it is aborted."""
    before = _counts()
    with serving(max_connections=64, write_stall_s=2.0) as (host, port):
        stalled = Stalled(host, port, 3, path="/big", requests=1)
        try:
            stalled.pump(quiet_s=0.2)
            wait_until(lambda: stalled.open() == 0, "unread answers aborted", 2.0 + 20)
            assert _delta(before)["stalled"] == 3
        finally:
            stalled.close()


def test_at_the_cap_a_newcomer_displaces_a_stalled_reader() -> None:
    before = _counts()
    cap = 16
    with serving(max_connections=cap, write_stall_s=120.0, displace_after_s=0.5) as (h, p):
        stalled = Stalled(h, p, cap)
        try:
            answered = ANSWERED["/healthz"]
            stalled.pump(quiet_s=2.0)  # the server took nothing for 2 s: every one is stalled
            assert stalled.open() == cap
            # each was answered until its answers waited unread, then its pipelined requests
            # waited too: a few dozen answers each (a 4 KiB window), not the 30,000 it sent
            assert ANSWERED["/healthz"] - answered < cap * 1_000
            answers = [get(h, p, "/healthz") for _ in range(5)]
            assert all(a.startswith(OK) for a in answers)
            # the first displaced the longest-stalled one; the rest fit in its place
            assert _delta(before) == {
                "stalled": 0,
                "displaced": 1,
                "timeout": 0,
                "limit": 0,
                "slow": 0,
            }
            assert stalled.open() == cap - 1
        finally:
            stalled.close()


def test_a_connection_being_answered_is_not_displaced() -> None:
    before = _counts()
    with serving(max_connections=2, displace_after_s=0.2) as (host, port):
        waiting = []
        for _ in range(2):
            sock = socket.create_connection((host, port), timeout=10)
            sock.sendall(f"GET /slow HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            waiting.append(sock)
        try:
            time.sleep(1.0)  # both waiting on the app, longer than displace_after_s
            try:
                answer = get(host, port, "/healthz")
            except ConnectionResetError:
                answer = b""
            assert answer == b""  # refused at the cap
            for sock in waiting:
                assert sock.recv(65536).startswith(OK)
            assert _delta(before) == {
                "stalled": 0,
                "displaced": 0,
                "timeout": 0,
                "limit": 1,
                "slow": 0,
            }
        finally:
            for sock in waiting:
                sock.close()


def test_a_slow_steady_reader_is_kept() -> None:
    """4 MiB read 512 KiB every half second (4 s in all), with a write-stall timeout of
    1.5 s: the client takes something often enough, so it gets every byte."""
    before = _counts()
    with serving(write_stall_s=1.5) as (host, port):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
        sock.settimeout(10)
        sock.connect((host, port))
        try:
            sock.sendall(f"GET /big HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            got = bytearray()
            head = b""
            while len(got) < BIG:
                goal = len(got) + (512 << 10)
                while len(got) < min(goal, BIG):
                    part = sock.recv(65536)
                    assert part, f"closed after {len(got)} bytes of the body"
                    if not head:
                        head, _, rest = part.partition(b"\r\n\r\n")
                        part = rest
                    got += part
                time.sleep(0.5)
            assert head.startswith(OK)
            assert len(got) == BIG
        finally:
            sock.close()
    assert _delta(before)["stalled"] == _delta(before)["slow"] == 0


def _healthz(host: str, port: int, within: float) -> bool:
    """Whether a ``GET /healthz`` on a connection of its own, with a 1 s timeout like the
    kubelet's and tried again until ``within`` seconds have passed, got 200."""
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            if get(host, port, "/healthz", timeout=1.0).startswith(OK):
                return True
        except OSError:
            time.sleep(0.1)
    return False


def test_at_the_cap_a_newcomer_displaces_a_slow_reader() -> None:
    """The probe's slow readers hold every slot, each acknowledging a little every 0.6 s:
    honest probes still get in, by displacing the one owing longest, and only slow readers
    are displaced (every displacement counted is one of theirs the server ended)."""
    before = _counts()
    cap = 8
    with (
        serving(max_connections=cap, write_stall_s=120.0) as (host, port),
        SlowReaders(host, port, cap) as readers,
    ):
        wait_until(lambda: readers.accepted >= cap, "the slow readers hold every slot", 30)
        time.sleep(2.0)  # each has owed its answers longer than displace_after_s
        answered = [_healthz(host, port, within=10.0) for _ in range(5)]
        readers.stop()
        assert answered == [True] * 5
        got = _delta(before)
        assert got["displaced"] > 0
        assert got["displaced"] == readers.ended  # none of the honest ones
        assert got["stalled"] == got["slow"] == got["timeout"] == 0


def test_a_reader_below_the_rate_floor_is_aborted() -> None:
    """Taking 2 KiB every 0.3 s (under 7 KB/s) of pipelined answers, never stalling: the
    answers have waited longer than the write-stall timeout at under the 16 KiB/s floor, so
    the connection is aborted, counted ``slow``."""
    before = _counts()
    with (
        serving(write_stall_s=1.0) as (host, port),
        SlowReaders(host, port, 1, period=0.3) as readers,
    ):
        wait_until(lambda: readers.ended >= 1, "the slow reader aborted", 30)
    got = _delta(before)
    assert got["slow"] >= 1
    assert got["stalled"] == got["displaced"] == got["limit"] == 0


# a real daemon


@pytest.fixture(scope="module")
def spoke(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Spoke, str]]:
    """A spoke daemon (its admin API capped at 256) with a ``--metrics`` port (capped at
    32); yields it and the metrics port's URL."""
    root = tmp_path_factory.mktemp("stalled")
    src = root / "src"
    src.mkdir()
    (src / "f.bin").write_bytes(os.urandom(65_536))
    assert publish(root / "hub", "ds", src) == "v1"
    region = Region(root)
    try:
        region.start_hub()
        metrics = f"127.0.0.1:{_free_port()}"
        spoke = region.add("spoke", ("--metrics", metrics))
        region.start(spoke, peers=[spoke])
        yield spoke, f"http://{metrics}"
    finally:
        region.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _honest(url: str, calls: int, within: float) -> int:
    """How many of ``calls`` ``GET /healthz`` (each retried until ``within`` seconds have
    passed since the first) got 200."""
    ok = 0
    end = time.monotonic() + within
    for _ in range(calls):
        while time.monotonic() < end:
            try:
                if httpx.get(f"{url}/healthz", timeout=3).status_code == 200:
                    ok += 1
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
    return ok


@pytest.mark.parametrize(("port", "cap"), [("admin", 256), ("metrics", 32)])
def test_a_daemon_holds_no_slot_for_clients_that_never_read(
    spoke: tuple[Spoke, str], port: str, cap: int
) -> None:
    """The probe's flood: ``cap`` connections pipelining ``GET /healthz``, never reading.
    Honest probes get their answers within seconds, and every flooding connection is closed
    within the write-stall timeout (or the request timeout, if its answers all fitted in
    the buffers) and counted."""
    daemon, metrics_url = spoke
    assert daemon.proc is not None
    url = daemon.admin if port == "admin" else metrics_url
    host, _, p = url.removeprefix("http://").rpartition(":")

    def counts() -> dict[str, float]:
        return {r: daemon.metric(CLOSED, reason=r) for r in REASONS}

    before = counts()
    rss = [_rss_mib(daemon.proc.pid)]
    stalled = Stalled(host, int(p), cap)
    try:
        stalled.pump()
        rss.append(_rss_mib(daemon.proc.pid))
        assert _honest(url, 15, 30.0) == 15
        rss.append(_rss_mib(daemon.proc.pid))
        wait_until(
            lambda: stalled.open() == 0,
            "every flooding connection closed",
            max(WRITE_STALL_S, REQUEST_TIMEOUT_S) + 30,
        )
    finally:
        stalled.close()
    rss.append(_rss_mib(daemon.proc.pid))
    after = counts()
    got = {r: after[r] - before[r] for r in REASONS}
    print(f"{port}: closed {got}; daemon RSS before/flooded/probed/after {rss} MiB")
    assert got["stalled"] + got["displaced"] + got["timeout"] + got["slow"] == cap
    assert got["stalled"] + got["displaced"] + got["slow"] > 0
    assert max(rss) < 512


def test_the_kubelet_gets_through_slow_readers_on_the_metrics_port(
    spoke: tuple[Spoke, str],
) -> None:
    """The probe's flood of the ``--metrics`` port: 32 slow readers of pipelined
    ``GET /metrics`` hold every slot, each taking 2 KiB every 0.6 s (one opened again for
    each the daemon ends). Of 8 kubelet-style ``GET /healthz``, one every 2 s with a 1 s
    timeout, at least 6 get 200 and never 3 in a row fail (the kubelet restarts the pod
    after 6 in a row; before the fix none got through)."""
    _, metrics_url = spoke
    host, _, p = metrics_url.removeprefix("http://").rpartition(":")
    results: list[bool] = []
    with SlowReaders(host, int(p), 32, path="/metrics") as readers:
        wait_until(lambda: readers.accepted >= 32, "the slow readers hold every slot", 30)
        time.sleep(3.0)  # the probe waited 5 s; each has owed its answers for seconds
        for _ in range(8):
            start = time.monotonic()
            try:
                results.append(httpx.get(f"{metrics_url}/healthz", timeout=1).status_code == 200)
            except httpx.HTTPError:
                results.append(False)
            time.sleep(max(0.0, 2.0 - (time.monotonic() - start)))
    print(f"kubelet probes {results}; slow readers accepted {readers.accepted}")
    assert sum(results) >= 6
    assert "FFF" not in "".join("T" if ok else "F" for ok in results)


def test_a_connection_rate_flood_does_not_keep_the_kubelet_out(
    spoke: tuple[Spoke, str],
) -> None:
    """The twelfth probe: silent connections opened 50 a second and held 3 s each kept all
    32 slots of ``--metrics`` younger than the second a connection had to owe before it
    could be displaced: the kubelet's ``/healthz`` failed 9 times in a row. The one owing
    longest goes at 50 ms now."""
    _, metrics_url = spoke
    host, _, p = metrics_url.removeprefix("http://").rpartition(":")
    with ConnectionFlood(host, int(p), rate=100, hold_s=3.0) as flood:
        time.sleep(1.0)  # the flood fills the slots first
        results = kubelet(f"{metrics_url}/healthz", probes=12, every_s=0.5)
    assert flood.opened >= 100
    assert sum(results) >= 10 and longest_failing_run(results) <= 2, results
