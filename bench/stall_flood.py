"""What a sustained flood of block streams that are never read makes the hub hold.

    python -m bench.stall_flood [--tokens 6] [--streams 40] [--every 3] [--seconds 60]
                                [--stall-timeout 30] [--json]

Publishes eight 4 MiB files to a local hub (``strata-hub serve`` with tokens, plaintext on
127.0.0.1), then, for ``--seconds``, each of ``--tokens`` tokens opens ``--streams``
``ReadBlocks`` streams every ``--every`` seconds on its own connection, each asking for
one block, and never reads a byte of any reply (its HTTP/2 receive window stays at the
64 KiB default: BDP probing off). Meanwhile one more token reads a block every second, as
a spoke would, and counts what it was served. Then the flooding connections close.

Prints the hub's resident memory (``/proc/PID/status`` ``VmRSS``) at rest, its peak during
the flood, 5 s and 15 s after the connections closed (past the hub's heap trims), the
well-behaved token's reads (served, refused, slowest) and the refusals the hub counted by
limit. The number to hold against is the hub Deployment's memory limit (1 GiB,
deploy/k8s/base/hub/statefulset.yaml); ``hub/limits/budget.py`` gives the sizing it promises.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc
import grpc.aio

from bench.bulk_flood import rss_mib
from deploy.local import LocalStack, publish
from protocol.hub.v1 import hub_pb2, hub_pb2_grpc

MiB = 1 << 20
READER = "bench-stall-reader-0123456789abcdef"
NEVER_READ = (("grpc.use_local_subchannel_pool", 1), ("grpc.http2.bdp_probe", 0))
"""A client that never reads: its stream windows stay at HTTP/2's 64 KiB."""


@dataclass
class Result:
    """One flood's figures (MiB are the hub's ``VmRSS``; seconds of wall time)."""

    rest_mib: int
    peak_mib: int
    after_5s_mib: int
    after_15s_mib: int
    streams_opened: int
    reads_served: int
    reads_refused: int
    median_read_s: float
    slowest_read_s: float
    hub_cpu_s: float
    refusals: dict[str, float] = field(default_factory=dict)


def _digests(address: str) -> list[str]:
    with grpc.insecure_channel(address) as channel:
        stub = hub_pb2_grpc.HubStub(channel)
        meta = (("authorization", f"Bearer {READER}"),)
        entries = stub.GetManifest(
            hub_pb2.GetManifestRequest(dataset="ds", ref="latest"), metadata=meta
        )
        return [block.digest for entry in entries for block in entry.blocks]


def _refusals(metrics: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("strata_hub_limit_refusals_total{"):
            labels, _, value = line.partition("} ")
            out[labels.split('limit="')[1].split('"')[0]] = float(value)
    return out


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _reader(
    address: str, digests: list[str], stop: asyncio.Event, out: dict[str, float], took: list[float]
) -> None:
    """Reads one block a second with the well-behaved token; counts what it got."""
    meta = (("authorization", f"Bearer {READER}"),)
    options = (("grpc.use_local_subchannel_pool", 1),)
    async with grpc.aio.insecure_channel(address, options=options) as channel:
        stub = hub_pb2_grpc.HubStub(channel)
        turn = 0
        while not stop.is_set():
            digest = digests[turn % len(digests)]
            turn += 1
            started = time.monotonic()
            request = hub_pb2.ReadBlocksRequest(digests=[digest])
            got = 0
            try:
                async for chunk in stub.ReadBlocks(iter([request]), timeout=60, metadata=meta):
                    got += len(chunk.data)
                out["served" if got == 4 * MiB else "refused"] += 1
            except grpc.aio.AioRpcError:
                out["refused"] += 1
            took.append(time.monotonic() - started)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)


async def _attack(
    args: argparse.Namespace, address: str, pid: int, digests: list[str], metrics: str
) -> tuple[int, int, dict[str, float], dict[str, float], list[float], float]:
    """The flood and the well-behaved reader beside it, in one event loop (grpc.aio: no
    thread per call). Returns the calls opened, the peak RSS (MiB), the hub's refusals by
    limit, the reader's counts and read times, and the hub's CPU seconds meanwhile."""
    attackers = [f"bench-stall-{i:02d}-0123456789abcdef" for i in range(args.tokens)]
    stop = asyncio.Event()
    reads = {"served": 0.0, "refused": 0.0}
    took: list[float] = []
    cpu_before = _cpu_s(pid)
    reader = asyncio.ensure_future(_reader(address, digests, stop, reads, took))
    channels = [grpc.aio.insecure_channel(address, options=NEVER_READ) for _ in attackers]
    calls: list[grpc.aio.StreamStreamCall] = []
    peak = rss_mib(pid)
    started = time.monotonic()
    next_round = started
    try:
        while time.monotonic() - started < args.seconds:
            if time.monotonic() >= next_round:
                for token, channel in zip(attackers, channels, strict=True):
                    stub = hub_pb2_grpc.HubStub(channel)
                    meta = (("authorization", f"Bearer {token}"),)
                    for n in range(args.streams):
                        request = hub_pb2.ReadBlocksRequest(digests=[digests[n % len(digests)]])
                        calls.append(stub.ReadBlocks(iter([request]), metadata=meta))
                next_round += args.every
            peak = max(peak, rss_mib(pid))
            await asyncio.sleep(0.25)
        refusals = await asyncio.to_thread(_refusals, metrics)
    finally:
        for call in calls:
            call.cancel()
        for channel in channels:
            await channel.close()
    cpu = _cpu_s(pid) - cpu_before
    closed = time.monotonic()
    while time.monotonic() - closed < 5:
        peak = max(peak, rss_mib(pid))
        await asyncio.sleep(0.25)
    stop.set()
    await asyncio.wait_for(reader, 90)
    return len(calls), peak, refusals, reads, took, cpu


def flood(args: argparse.Namespace, work: Path) -> Result:
    """Runs one flood against a fresh hub under ``work``; see the module's docstring."""
    (work / "src").mkdir()
    for i in range(8):
        (work / "src" / f"f{i}.bin").write_bytes(os.urandom(4 * MiB))
    publish(work / "hub", "ds", work / "src")
    attackers = [f"bench-stall-{i:02d}-0123456789abcdef" for i in range(args.tokens)]
    tokens = work / "tokens.yaml"
    tokens.write_text("".join(f'"{t}": ["ds"]\n' for t in (*attackers, READER)))
    tokens.chmod(0o600)
    with LocalStack() as stack:
        metrics = "127.0.0.1:" + str(_free_port())
        extra = ("--tokens", str(tokens), "--insecure", "--stall-timeout", str(args.stall_timeout))
        address = stack.start_hub(work / "hub", metrics=metrics, extra=extra)
        assert stack.hub is not None
        pid = stack.hub.pid
        digests = _digests(address)
        time.sleep(1)
        rest = rss_mib(pid)
        opened, peak, refusals, reads, took, cpu = asyncio.run(
            _attack(args, address, pid, digests, metrics)
        )
        after_5 = rss_mib(pid)
        time.sleep(10)
        after_15 = rss_mib(pid)
        return Result(
            rest,
            peak,
            after_5,
            after_15,
            opened,
            int(reads["served"]),
            int(reads["refused"]),
            round(statistics.median(took), 2) if took else 0.0,
            round(max(took, default=0.0), 2),
            round(cpu, 1),
            refusals,
        )


def _free_port() -> int:
    import socket

    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the flood and print its figures; 0 when the hub started."""
    parser = argparse.ArgumentParser(prog="python -m bench.stall_flood", description=__doc__)
    parser.add_argument("--tokens", type=int, default=6)
    parser.add_argument("--streams", type=int, default=40, help="streams a token opens a round")
    parser.add_argument("--every", type=float, default=3.0, help="seconds between rounds")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the flood lasts")
    parser.add_argument("--stall-timeout", type=float, default=30.0, help="the hub's, seconds")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 65536)), hard))
    with tempfile.TemporaryDirectory(prefix="strata-stall-flood-") as tmp:
        result = flood(args, Path(tmp))
    if args.json:
        print(json.dumps(asdict(result)))
        return 0
    print(f"hub RSS at rest {result.rest_mib} MiB, peak {result.peak_mib} MiB during the flood")
    print(
        f"after the flood closed: {result.after_5s_mib} MiB (5 s),"
        f" {result.after_15s_mib} MiB (15 s)"
    )
    print(
        f"streams opened {result.streams_opened}; refusals {result.refusals}; hub CPU during"
        f" the flood {result.hub_cpu_s} s"
    )
    print(
        f"well-behaved token: {result.reads_served} reads served, {result.reads_refused} refused,"
        f" median {result.median_read_s} s, slowest {result.slowest_read_s} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
