"""A doorway counts callers by network (strata_local/doorway.py, ``caller_network``): an
IPv4 address, an IPv6 address's /64. One host is routed a whole /64 and may send from any
address in it, so per address its flood of fresh addresses was as many new callers as
connections (issue 39's twenty-first probe, F2): each went in front of a new spoke's turn
and the slots displaced the spoke. The flood here comes from a /64 routed to the loopback
of a network namespace the test creates (``unshare -n``), as an attacker's host would use
its own."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from strata_local.doorslots import DoorSlot
from strata_local.doorway import caller_network
from strata_local.streamdoor import StreamDoor

REPO = Path(__file__).resolve().parents[2]
FLOOD_NET = "2001:db8:7::"
NEWCOMER = "2001:db8:8::1"
RATE = 2.0  # handshakes begun a second: the flood always has more waiting
SLOTS = 128


@pytest.mark.parametrize(
    ("host", "network"),
    [
        ("10.0.0.7", "10.0.0.7"),
        ("2001:db8::7", "2001:db8::/64"),
        ("2001:db8::ffff:1:2", "2001:db8::/64"),
        ("2001:db8:0:1::7", "2001:db8:0:1::/64"),
        ("::ffff:10.0.0.7", "10.0.0.7"),  # a dual-stack listener's IPv4 caller
        ("fe80::1%eth0", "fe80::%eth0/64"),
        ("::1", "::/64"),
        ("not an address", "not an address"),
        ("2001:db8::zz", "2001:db8::zz"),
    ],
)
def test_a_caller_is_its_ipv4_address_or_its_ipv6_64(host: str, network: str) -> None:
    assert caller_network(host) == network


def _child() -> None:
    """Runs in the namespace: a plaintext stream door on [::1] beginning RATE handshakes a
    second, a flood from fresh addresses of FLOOD_NET/64 until the newcomer is answered,
    and the newcomer from another /64; prints what was handed on, as JSON."""
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    for route in (f"{FLOOD_NET}/64", f"{NEWCOMER}/128"):  # AnyIP: every address is ours
        subprocess.run(["ip", "-6", "route", "add", "local", route, "dev", "lo"], check=True)
    handed: list[str] = []

    async def echo(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, slot: DoorSlot
    ) -> None:
        handed.append(slot.host)
        writer.write(await reader.readexactly(4))
        await writer.drain()
        writer.close()

    def connect(source: str, port: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_IP, 15, 1)  # IP_FREEBIND: any address of the routed /64
        sock.bind((source, 0))
        sock.settimeout(10)
        sock.connect(("::1", port))
        sock.sendall(b"ping")
        return sock

    def flood(port: int, stop: threading.Event, opened: list[socket.socket]) -> None:
        n = 0
        while not stop.is_set() and n < 20_000:
            n += 1
            with contextlib.suppress(OSError):  # displaced before it was written to
                opened.append(connect(f"{FLOOD_NET}{n >> 16:x}:{n & 0xFFFF:x}", port))
            stop.wait(0.003)

    def newcomer(port: int) -> tuple[int, bytes]:
        sock = connect(NEWCOMER, port)
        before = len(handed)
        try:
            answer = sock.recv(4)
        except OSError:
            answer = b""
        sock.close()
        return before, answer

    async def main() -> dict[str, object]:
        door = StreamDoor(SLOTS, 30.0, echo, 4, handshake_rate=RATE)
        port = await door.start("::1", 0)
        stop, opened = threading.Event(), []
        flooder = threading.Thread(target=flood, args=(port, stop, opened))
        flooder.start()
        while door.slots.open < SLOTS:  # the slots full, the flood still coming
            await asyncio.sleep(0.05)
        before, answer = await asyncio.to_thread(newcomer, port)
        waiting = door.turns.waiting
        stop.set()
        await asyncio.to_thread(flooder.join)
        for sock in opened:
            sock.close()
        await door.close()
        return {
            "answer": answer.decode(),
            "turns_before_it": handed.index(f"{NEWCOMER[:-1]}/64") - before
            if f"{NEWCOMER[:-1]}/64" in handed
            else None,
            "flood_waiting": waiting,
            "flood_opened": len(opened),
            "networks": sorted(set(handed)),
            "displaced": door.slots.displaced,
        }

    print(json.dumps(asyncio.run(main())))


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None,
    reason="needs root, unshare and ip (a network namespace of its own)",
)
def test_a_flood_from_one_ipv6_64_is_one_caller_and_a_newcomer_has_the_next_turn() -> None:
    done = subprocess.run(
        ["unshare", "-n", sys.executable, "-c", f"from {__name__} import _child; _child()"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["answer"] == "ping"
    # one turn may have been under way as it arrived; then it is next, before the flood
    assert result["turns_before_it"] in (0, 1)
    assert result["flood_waiting"] > 0  # the flood still had connections waiting
    assert set(result["networks"]) <= {f"{FLOOD_NET}/64", "2001:db8:8::/64"}
    assert result["displaced"] > 0  # the flood turned over its own slots, not the newcomer's
