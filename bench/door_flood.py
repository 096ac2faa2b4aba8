"""New peers under a flood of silent connections to a spoke's peer port: gRPC core's own
connection cap (the peer port before its door) and the door (``strata_local.door``), side
by side; and the door again forgetting who proved a token (``door-new``: each new peer is
as new as the flood's addresses, its handshake's turn not first,
``strata_local.handshakes``, ``strata_local.knownhosts``).

    python -m bench.door_flood [--rates 1200,2400] [--addresses 2000] [--seconds 15]
                               [--first silent|hello] [--networks 0]

For each port and rate: a child process serves the peer port (mTLS and the region's token,
1,024 connections at most, as deployed), another opens connections at the rate from
``--addresses`` loopback addresses (250 a /16, or spread over ``--networks`` /16s, the
new peers' 127.0.0.1 in none of them; none sends a byte; with ``--first hello``, each sends
a real TLS ClientHello and then nothing, so the server does its half of every handshake,
as a flood that costs its sender nothing more would), and this one dials a new peer
every 0.25 s — a fresh channel with the region's certificate and token — and calls
``Probe`` with a 2 s timeout (the default ``--peer-timeout``). Reported: new peers
answered, their median latency, the flood's achieved rate, and the serving process's CPU
milliseconds per flood connection (user + system, all its threads: the figure that
travels between machines).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import grpc.aio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from bench import floods
from bench.measure import tree_cpu_seconds
from bench.peer_bulk import ISSUER, _cache, _hold, _Hub
from deploy.local import free_port
from deploy.pki import LocalCa
from protocol.spoke.v1 import peer_pb2_grpc
from spoke.fetch.fetcher import Fetcher
from spoke.fetch.scheduler import FetchScheduler
from spoke.mesh.admission import ScopeCheck
from spoke.mesh.grantcheck import GrantVerifier
from spoke.mesh.grants import HubGrantKeys
from spoke.mesh.membership import Membership
from spoke.mesh.peerclient import PeerClient
from spoke.mesh.peerservice import REQUEST_BYTES, PeerService, start_peer_server
from spoke.mesh.probedoor import ProbeDoor
from spoke.mesh.source import MeshSource
from spoke.mesh.transport import MAX_CONNECTIONS, PeerTls, PeerToken, server_options
from strata_local import knownhosts

PORTS = ("grpc-cap", "door", "door-new")


def _credentials(root: Path) -> tuple[PeerTls, PeerToken]:
    if not (root / "token").exists():
        (root / "pki").mkdir(exist_ok=True)
        ca = LocalCa(root / "pki", "region-ca")
        leaf = ca.issue("spokes")
        (root / "token").write_text("bench-region-token-0123456789\n")
        (root / "paths").write_text(f"{leaf.cert}\n{leaf.key}\n{ca.cert}\n")
    cert, key, ca_cert = (Path(p) for p in (root / "paths").read_text().split())
    return PeerTls(cert, key, ca_cert), PeerToken(root / "token")


def serve(root: Path, port: str, node: str) -> None:
    """The child: a peer port on ``node``, behind the door or gRPC core's cap alone."""

    async def main() -> None:
        tls, token = _credentials(root)
        cache, catalog = _cache(root / f"owner-{port}")
        _hold(catalog, {})
        keys = HubGrantKeys(None, pinned=Ed25519PublicKey.from_public_bytes(ISSUER.public_key))
        source = MeshSource(_Hub({}), Membership(node))
        service = PeerService(
            node, cache, FetchScheduler(Fetcher(source), cache), source,
            GrantVerifier(node, keys), ScopeCheck(catalog), token=token,
        )  # fmt: skip
        if port.startswith("door"):
            if port == "door-new":  # no address is remembered as having proved a token
                knownhosts.KNOWN_S = 0.0
            server, _ = await start_peer_server(service, node, tls)
            stopping = server.stop
        else:  # the peer port before its door: gRPC core closes newcomers at its cap
            plain = grpc.aio.server(
                interceptors=[ProbeDoor(service.admit_probe)],
                options=[
                    ("grpc.max_receive_message_length", REQUEST_BYTES),
                    *server_options(MAX_CONNECTIONS),
                ],
            )
            peer_pb2_grpc.add_SpokePeerServicer_to_server(service, plain)  # type: ignore[no-untyped-call]
            plain.add_secure_port(node, tls.server_credentials())
            await plain.start()
            stopping = plain.stop
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        print("ready", flush=True)
        await stop.wait()
        await stopping(0)

    asyncio.run(main())


def flood(
    node: str, rate: float, addresses: int, seconds: float, first: str, root: Path, networks: int
) -> None:
    """The child: connections to ``node`` that send nothing (``first`` is ``silent``) or a
    real TLS ClientHello (``hello``), then nothing (:func:`bench.floods.flood`)."""
    ca = _credentials(root)[0].ca
    assert ca is not None  # the region's CA: the peer port requires mTLS
    said = floods.client_hello(ca) if first == "hello" else b""
    floods.flood(node, rate, addresses, seconds, said, networks)


async def _probes(node: str, root: Path, seconds: float) -> tuple[int, int, float]:
    tls, token = _credentials(root)
    answered, latencies, tries = 0, [], 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        began = time.monotonic()
        tries += 1
        client = PeerClient(node, token, tls)
        try:
            await client.probe(2.0)
            answered += 1
            latencies.append(time.monotonic() - began)
        except Exception:  # any failure is a new peer kept out
            pass
        finally:
            await client.close()
        await asyncio.sleep(max(0.0, 0.25 - (time.monotonic() - began)))
    latencies.sort()
    return answered, tries, latencies[len(latencies) // 2] if latencies else float("nan")


def run(
    root: Path, port: str, rate: float, addresses: int, seconds: float, first: str, networks: int
) -> str:
    """One flood against a fresh peer port; a table row."""
    node = f"127.0.0.1:{free_port()}"
    me = [sys.executable, "-m", "bench.door_flood"]
    server = subprocess.Popen(
        [*me, "--serve", str(root), port, node], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        sizes = (str(rate), str(addresses), str(seconds))
        flooder = subprocess.Popen(
            [*me, "--flood", node, *sizes, first, str(root), str(networks)],
            stdout=subprocess.PIPE,
            text=True,
        )
        cpu_before = tree_cpu_seconds(server.pid)
        time.sleep(min(3.0, seconds / 4))
        answered, tries, p50 = asyncio.run(_probes(node, root, seconds - min(3.0, seconds / 4)))
        achieved = (flooder.communicate()[0] or "0").split()[-1]
        cpu_ms = (tree_cpu_seconds(server.pid) - cpu_before) * 1000 / (float(achieved) * seconds)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    row = f"| {rate:,.0f} ({achieved}) | {port} | {answered} of {tries} | {p50:.3f} |"
    return f"{row} {cpu_ms:.3f} |"


def main(argv: list[str] | None = None) -> None:
    """Parse the options and print one table row per port and rate."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rates", default="1200,2400", help="connections a second, commas")
    parser.add_argument("--addresses", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--serve", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument(
        "--first",
        choices=("silent", "hello"),
        default="silent",
        help="what a flood connection sends",
    )
    parser.add_argument(
        "--networks",
        type=int,
        default=0,
        help="spread the flood's addresses over this many /16s (1 to 150; 0: 250 a /16)",
    )
    parser.add_argument("--flood", nargs=7, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        return serve(Path(args.serve[0]), args.serve[1], args.serve[2])
    if args.flood:
        node, rate, addresses, seconds, first, root, networks = args.flood
        return flood(
            node, float(rate), int(addresses), float(seconds), first, Path(root), int(networks)
        )
    try:
        rates = [float(r) for r in args.rates.split(",")]
    except ValueError:
        parser.error(f"--rates must be numbers separated by commas, got {args.rates!r}")
    if any(r <= 0 for r in rates) or not 1 <= args.addresses <= 25_000 or args.seconds < 4:
        parser.error("rates must be positive, --addresses 1 to 25000, --seconds at least 4")
    if not 0 <= args.networks <= 150:
        parser.error("--networks must be 0 to 150")
    what = "silent connections" if args.first == "silent" else "whole TLS ClientHellos"
    spread = f"{args.networks} /16s" if args.networks else "250 a /16"
    print(f"new peers (Probe, 2 s) under {what} from {args.addresses} addresses ({spread})")
    print(
        "| rate /s (achieved) | peer port | new peers answered | p50 s"
        " | server CPU ms a flood connection |"
    )
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="door-flood-") as tmp:
        for rate in rates:
            for port in PORTS:
                row = run(
                    Path(tmp), port, rate, args.addresses, args.seconds, args.first, args.networks
                )
                print(row, flush=True)


if __name__ == "__main__":
    main()
