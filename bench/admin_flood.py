"""The admin server under a flood of silent connections, its displacement rule picked in
constant time (``strata_local.slotshare.Ledger``) and by a scan of every open connection
(the rule before, :func:`strata_local.slotshare.victim`), side by side.

    python -m bench.admin_flood [--rates 1200,4000] [--addresses 64] [--seconds 20]

For each rule and rate: a child process serves ``/healthz`` with the admin server's
protocol (``spoke.serve.adminserver``, 256 connections at most), another opens silent
connections at the rate from ``--addresses`` loopback addresses (0: from 127.0.0.1, the
kubelet's own), and this one asks ``/healthz`` once a second with a 1 s timeout, as the
kubelet's probe does. Reported: probes answered, their median latency, and the server's
CPU-milliseconds per connection that arrived.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import httpx

from deploy.local import free_port


def serve(listen: str, rule: str) -> None:
    """The child: the admin server's protocol with ``rule`` ("ledger" or "scan")."""
    from fastapi import FastAPI

    from spoke.serve import adminserver
    from strata_local.slotshare import victim

    logging.getLogger("spoke.serve.adminserver").setLevel(logging.ERROR)  # its per-minute line
    app = FastAPI()

    @app.get("/healthz")
    async def healthz() -> dict[str, bool]:
        return {"ok": True}

    config = adminserver.admin_config(app)
    if rule == "scan":

        class Scan(config.http):  # type: ignore[name-defined,misc]
            def _displace(self) -> bool:
                held: Counter[str] = Counter()
                owing: list[tuple[str, float, Any]] = []
                for other in self.connections:
                    if other.transport is not None:
                        held[other._client] += 1
                        since = other._observe().owing_since
                        if since is not None:
                            owing.append((other._client, since, other))
                chosen = victim(self._client, owing, held, time.monotonic(), self.displace_after_s)
                if chosen is None:
                    return False
                chosen._drop("displaced")
                return True

        config.http = Scan

    async def main() -> None:
        server = adminserver.AdminServer(config)
        asyncio.get_running_loop().add_signal_handler(
            signal.SIGTERM, lambda: setattr(server, "should_exit", True)
        )
        await server.serve(sockets=[adminserver.bind(listen)])
        usage = resource.getrusage(resource.RUSAGE_SELF)
        print(f"{usage.ru_utime + usage.ru_stime:.3f}", flush=True)

    asyncio.run(main())


def flood(port: int, rate: float, addresses: int, seconds: float) -> None:
    """The child: silent connections to ``port`` at ``rate`` a second; prints how many."""
    start, opened, held = time.monotonic(), 0, []
    while time.monotonic() - start < seconds:
        sock = socket.socket()
        sock.setblocking(False)
        n = opened % addresses if addresses else 0
        sock.bind((f"127.{10 + n // 250}.{n % 250}.9", 0) if addresses else ("127.0.0.1", 0))
        try:
            sock.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        except OSError:
            sock.close()
        held.append(sock)
        if len(held) > 4000:
            for old in held[:1000]:
                old.close()
            del held[:1000]
        opened += 1
        time.sleep(max(0.0, start + opened / rate - time.monotonic()))
    print(opened, flush=True)


def run(rule: str, rate: float, addresses: int, seconds: float) -> dict[str, float]:
    """One flood against a fresh server; the probes' outcome and the server's CPU."""
    port = free_port()
    me = [sys.executable, "-m", "bench.admin_flood"]
    server = subprocess.Popen(
        [*me, "--serve", f"127.0.0.1:{port}", "--rule", rule], stdout=subprocess.PIPE, text=True
    )
    url = f"http://127.0.0.1:{port}/healthz"
    try:
        for _ in range(100):
            try:
                httpx.get(url, timeout=1.0)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        flooder = subprocess.Popen(
            [*me, "--flood", str(port), str(rate), str(addresses), str(seconds)],
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(min(3.0, seconds / 4))
        answered, latencies = 0, []
        probes = int(seconds - min(3.0, seconds / 4)) - 1
        for _ in range(probes):
            began = time.monotonic()
            try:
                answered += httpx.get(url, timeout=1.0).status_code == 200
                latencies.append(time.monotonic() - began)
            except httpx.HTTPError:
                pass
            time.sleep(max(0.0, 1.0 - (time.monotonic() - began)))
        opened = int((flooder.communicate()[0] or "0").split()[-1])
    finally:
        server.send_signal(signal.SIGTERM)
        cpu = float((server.communicate(timeout=30)[0] or "nan").split()[-1])
    latencies.sort()
    return {
        "answered": answered,
        "probes": probes,
        "p50_s": latencies[len(latencies) // 2] if latencies else float("nan"),
        "cpu_ms_per_arrival": 1000 * cpu / max(opened, 1),
    }


def main(argv: list[str] | None = None) -> None:
    """Parse the options and print one table row per rule and rate."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="1200,4000", help="connections a second, commas")
    parser.add_argument("--addresses", type=int, default=64, help="0: 127.0.0.1 alone")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--rule", default="ledger", help=argparse.SUPPRESS)
    parser.add_argument("--flood", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        return serve(args.serve, args.rule)
    if args.flood:
        port, rate, addresses, seconds = args.flood
        return flood(int(port), float(rate), int(addresses), float(seconds))
    try:
        rates = [float(r) for r in args.rates.split(",")]
    except ValueError:
        parser.error(f"--rates must be numbers separated by commas, got {args.rates!r}")
    if any(r <= 0 for r in rates) or args.addresses < 0 or args.seconds < 3:
        parser.error("rates must be positive, --addresses at least 0, --seconds at least 3")
    print(f"admin server, silent connections from {args.addresses or '127.0.0.1'} addresses")
    print("| rate /s | rule | /healthz answered | p50 s | server CPU ms per arrival |")
    print("|---|---|---|---|---|")
    for rate in rates:
        for rule in ("scan", "ledger"):
            got = run(rule, rate, args.addresses, args.seconds)
            print(
                f"| {rate:,.0f} | {rule} | {got['answered']:.0f} of {got['probes']:.0f} | "
                f"{got['p50_s']:.3f} | {got['cpu_ms_per_arrival']:.3f} |",
                flush=True,
            )


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
