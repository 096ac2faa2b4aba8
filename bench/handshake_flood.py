"""What a flood of TLS ClientHellos makes a bulk port hold: TLS begun on every connection
that holds a slot (the hub's and spokes' bulk ports before their stream door) and the
stream door (``strata_local.streamdoor``: TLS only for a whole ClientHello, at most
``HANDSHAKES`` pending), side by side.

    python -m bench.handshake_flood [--rate 1200] [--addresses 2000] [--seconds 12]

For each port and each kind of flood: a child process serves a TLS echo port with 1,024
connection slots shared by address (:class:`strata_local.doorslots.DoorSlots`, as the bulk
ports' default ``--bulk-max-connections``) and a 10 s handshake timeout; a second child opens
connections at ``--rate`` from ``--addresses`` loopback addresses, each sending all but the
last byte of a real ClientHello (``partial``) or the whole of it (``whole``), then nothing;
this process makes a new TLS client's round trip every 0.25 s (2 s timeout). Reported: the
server's peak RSS over its RSS at rest (``VmHWM`` − ``VmRSS`` before, MiB), new clients
answered, and the flood's achieved rate.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import floods
from deploy.local import free_port
from deploy.pki import LocalCa
from strata_local.doorslots import DoorSlot, DoorSlots
from strata_local.streamdoor import StreamDoor

PORTS = ("tls-per-slot", "stream-door")
SLOTS = 1024
HANDSHAKE_S = 10.0


def _pki(root: Path) -> tuple[Path, Path, Path]:
    if not (root / "paths").exists():
        ca = LocalCa(root, "bench-ca")
        leaf = ca.issue("localhost")
        (root / "paths").write_text(f"{leaf.cert}\n{leaf.key}\n{ca.cert}\n")
    cert, key, ca_cert = (Path(p) for p in (root / "paths").read_text().split())
    return cert, key, ca_cert


def _status(pid: int, field: str) -> int:
    """A ``/proc/PID/status`` field in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise OSError(f"no {field} for process {pid}")


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        writer.write(await asyncio.wait_for(reader.readexactly(4), HANDSHAKE_S))
        await writer.drain()
    except (OSError, asyncio.IncompleteReadError, TimeoutError):
        pass
    writer.close()


def serve(root: Path, port: str, node: str) -> None:
    """The child: a TLS echo port of ``port``'s kind on ``node`` until SIGTERM."""
    cert, key, _ = _pki(root)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    host, number = node.rsplit(":", 1)

    async def main() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        if port == "stream-door":

            async def handler(
                reader: asyncio.StreamReader, writer: asyncio.StreamWriter, slot: DoorSlot
            ) -> None:
                await _echo(reader, writer)

            door = StreamDoor(SLOTS, HANDSHAKE_S, handler, 4, tls=context)
            await door.start(host, int(number))
            print("ready", flush=True)
            await stop.wait()
            await door.close()
            return
        slots = DoorSlots(SLOTS)

        async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            address = writer.get_extra_info("peername")
            slot = slots.take(str(address[0]), str(address), lambda: writer.transport.abort())
            if slot is None:
                writer.transport.abort()
                return
            try:  # TLS begun once the connection holds a slot: the bulk ports before
                await writer.start_tls(context, ssl_handshake_timeout=HANDSHAKE_S)
                await _echo(reader, writer)
            except (OSError, TimeoutError, asyncio.CancelledError):
                writer.transport.abort()
            finally:
                slots.release(slot)

        server = await asyncio.start_server(connection, host, int(number), backlog=4096)
        print("ready", flush=True)
        await stop.wait()
        server.close()

    asyncio.run(main())


def flood(root: Path, node: str, kind: str, rate: float, addresses: int, seconds: float) -> None:
    """The child: connections sending a ClientHello (``kind``: ``whole``, or ``partial``,
    all but its last byte), then nothing (:func:`bench.floods.flood`)."""
    hello = floods.client_hello(_pki(root)[2])
    floods.flood(node, rate, addresses, seconds, hello if kind == "whole" else hello[:-1])


def _talk(node: str, ca_cert: Path) -> bool:
    host, port = node.rsplit(":", 1)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(str(ca_cert))
    try:
        raw = socket.create_connection((host, int(port)), timeout=2.0)
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            tls.sendall(b"ping")
            return tls.recv(4) == b"ping"
    except OSError:
        return False


def run(root: Path, port: str, kind: str, rate: float, addresses: int, seconds: float) -> str:
    """One flood against a fresh port; a table row."""
    node = f"127.0.0.1:{free_port()}"
    me = [sys.executable, "-m", "bench.handshake_flood"]
    server = subprocess.Popen(
        [*me, "--serve", str(root), port, node], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        rest = _status(server.pid, "VmRSS")
        flooder = subprocess.Popen(
            [*me, "--flood", str(root), node, kind, str(rate), str(addresses), str(seconds)],
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(2.0)
        answered, tries = 0, 0
        end = time.monotonic() + seconds - 2.0
        while time.monotonic() < end:
            began = time.monotonic()
            tries += 1
            answered += _talk(node, _pki(root)[2])
            time.sleep(max(0.0, 0.25 - (time.monotonic() - began)))
        achieved = (flooder.communicate()[0] or "0").split()[-1]
        peak = _status(server.pid, "VmHWM")
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    held = (peak - rest) / 1024
    return f"| {kind} | {rate:,.0f} ({achieved}) | {port} | {held:,.0f} | {answered} of {tries} |"


def main(argv: list[str] | None = None) -> None:
    """Parse the options and print one table row per flood and port."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1200.0, help="connections a second")
    parser.add_argument("--addresses", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--serve", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--flood", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        return serve(Path(args.serve[0]), args.serve[1], args.serve[2])
    if args.flood:
        root, node, kind, rate, addresses, seconds = args.flood
        return flood(Path(root), node, kind, float(rate), int(addresses), float(seconds))
    if args.rate <= 0 or not 1 <= args.addresses <= 25_000 or args.seconds < 4:
        parser.error("--rate must be positive, --addresses 1 to 25000, --seconds at least 4")
    print(f"TLS ClientHello floods from {args.addresses} addresses, {SLOTS} slots")
    print("| ClientHello | rate /s (achieved) | port | peak RSS over rest, MiB | new clients |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="handshake-flood-") as tmp:
        _pki(Path(tmp))
        for kind in ("partial", "whole"):
            for port in PORTS:
                row = run(Path(tmp), port, kind, args.rate, args.addresses, args.seconds)
                print(row, flush=True)


if __name__ == "__main__":
    main()
