"""A doorway counts callers by address (strata_local/doorway.py, ``caller_address``), a
dual-stack listener's IPv4 callers by their IPv4 address, and two addresses of one IPv6
/64 as two callers: a fleet of spokes often shares a /64 (a cloud subnet's, a node's
pods'), and counted as one caller it was the network holding most, displaced first by
any flood (issue 39's twenty-second probe: 248 of 500 spokes back 26 s after a hub
restart under a flood, against 500 after 12 s by address). The IPv6 callers come from a
/64 routed to the loopback of a network namespace the test creates (``unshare -n``)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from strata_local.doorslots import DoorSlot
from strata_local.doorway import caller_address
from strata_local.streamdoor import StreamDoor

REPO = Path(__file__).resolve().parents[2]
FLEET_NET = "2001:db8:7::"


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("10.0.0.7", "10.0.0.7"),
        ("::ffff:10.0.0.7", "10.0.0.7"),  # a dual-stack listener's IPv4 caller
        ("2001:db8::7", "2001:db8::7"),
        ("::ffff:1:2:3", "::ffff:1:2:3"),  # not IPv4-mapped: as it is
        ("::ffff:zz", "::ffff:zz"),
        ("fe80::1%eth0", "fe80::1%eth0"),
    ],
)
def test_a_caller_is_its_address_an_ipv4_mapped_one_as_ipv4(host: str, address: str) -> None:
    assert caller_address(host) == address


def _child() -> None:
    """Runs in the namespace: a plaintext stream door on [::] (dual stack) and callers
    from 127.0.0.1 and two addresses of FLEET_NET/64; prints the hosts its slots and its
    handler saw, as JSON."""
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    subprocess.run(
        ["ip", "-6", "route", "add", "local", f"{FLEET_NET}/64", "dev", "lo"], check=True
    )
    handed: list[str] = []

    async def echo(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, slot: DoorSlot
    ) -> None:
        handed.append(slot.host)
        writer.write(await reader.readexactly(4))
        await writer.drain()
        writer.close()

    def call(family: socket.AddressFamily, source: str, port: int) -> bytes:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_IP, 15, 1)  # IP_FREEBIND: any address of the /64
            sock.bind((source, 0))
            sock.settimeout(10)
            sock.connect(("127.0.0.1" if family == socket.AF_INET else "::1", port))
            sock.sendall(b"ping")
            return sock.recv(4)

    async def main() -> dict[str, object]:
        door = StreamDoor(8, 10.0, echo, 4)
        port = await door.start("::", 0)
        answers = [
            await asyncio.to_thread(call, family, source, port)
            for family, source in (
                (socket.AF_INET, "127.0.0.1"),
                (socket.AF_INET6, f"{FLEET_NET}1"),
                (socket.AF_INET6, f"{FLEET_NET}2"),
            )
        ]
        await door.close()
        return {"answers": [a.decode() for a in answers], "hosts": handed}

    print(json.dumps(asyncio.run(main())))


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None,
    reason="needs root, unshare and ip (a network namespace of its own)",
)
def test_a_dual_stack_door_counts_ipv4_callers_by_ipv4_and_each_ipv6_address_apart() -> None:
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
    assert result["answers"] == ["ping"] * 3
    assert result["hosts"] == ["127.0.0.1", f"{FLEET_NET}1", f"{FLEET_NET}2"]
