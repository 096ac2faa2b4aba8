"""One tenant's prewarm beside another tenant's misses: what a ``link_share`` keeps.

    python -m bench.tenant_link [--shares 0.2,1] [--prewarm 320MiB] [--files 600]
                                [--readers N] [--rtt-ms 0] [--rate 1Gbit] [--json FILE]

For each share of team-b's: publish team-a (``--files`` files of 256 KiB) and team-b
(``--prewarm`` bytes of 1 MiB files), both in 64 KiB blocks, to a local hub; start a spoke
whose ``--tenants`` file gives team-b that ``link_share`` (team-a what is left, at most
0.5; cache shares 0.3 each); then read team-a's files one after another through the
mount, 20 ms apart, each a miss — first alone (*quiet*), then while team-b prewarms
everything (*during*). Printed side by side: team-a's miss latency quiet and during
(p50, p90, and their ratio), the prewarm's rate, and the spoke's CPU seconds per GiB it
fetched. A share of 1 is the control (team-b may take the whole window while team-a
misses).

``--readers N``: instead of a prewarm, team-b's pod reads its files through the mount
with N threads — demand, which no link share holds (its misses take turns with team-a's
in the spoke, and the mount keeps 256 readahead requests outstanding).

``--rtt-ms`` above 0 puts the hub behind :mod:`bench.wan` (``--rate`` each way). All
traffic stays on 127.0.0.1. Needs /dev/fuse (the spoke starts its mount).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from bench.data import parse_size
from bench.measure import tree_cpu_seconds
from bench.wan import LinkSpec, WanProxy, parse_hostport, parse_rate
from deploy.local import LocalStack, admin_headers, publish

MiB = 1 << 20
BLOCK = 64 << 10
READ_GAP_S = 0.02
QUIET_READS = 40


@dataclass
class Result:
    """One share's run: team-a's misses quiet and during team-b's prewarm."""

    share: float
    quiet_p50_ms: float
    quiet_p90_ms: float
    during_p50_ms: float
    during_p90_ms: float
    during_reads: int
    prewarm_state: str
    prewarm_mb_s: float
    spoke_cpu_s_per_gib: float

    @property
    def ratio(self) -> float:
        """During over quiet, p50."""
        return self.during_p50_ms / self.quiet_p50_ms


def _files(root: Path, n: int, size: int) -> Path:
    root.mkdir(parents=True)
    for i in range(n):
        (root / f"f{i:05d}.bin").write_bytes(os.urandom(size))
    return root


def _quantiles(seconds: list[float]) -> tuple[float, float]:
    ordered = sorted(seconds)
    return ordered[len(ordered) // 2] * 1000, ordered[int(len(ordered) * 0.9)] * 1000


class Reader:
    """Reads team-a's files in order through the mount, each once (each a miss)."""

    def __init__(self, folder: Path, files: int) -> None:
        self.folder = folder
        self.files = files
        self.next = 0

    def read(self, until: threading.Event | None = None, count: int = 0) -> list[float]:
        took: list[float] = []
        while (len(took) < count) if until is None else not until.is_set():
            if self.next >= self.files:
                raise SystemExit("error: team-a ran out of files to miss; raise --files")
            path = self.folder / f"f{self.next:05d}.bin"
            self.next += 1
            started = time.perf_counter()
            path.read_bytes()
            took.append(time.perf_counter() - started)
            time.sleep(READ_GAP_S)
        return took


def _read_all(folder: Path, files: int, readers: int) -> tuple[int, float]:
    """team-b's pod: ``readers`` threads read ``files`` 1 MiB files through the mount, each
    once; the bytes read and the seconds it took."""
    names = iter(range(files))
    lock = threading.Lock()
    done = [0]

    def read() -> None:
        while True:
            with lock:
                n = next(names, None)
            if n is None:
                return
            size = len((folder / f"f{n:05d}.bin").read_bytes())
            with lock:
                done[0] += size

    started = time.perf_counter()
    threads = [threading.Thread(target=read) for _ in range(readers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return done[0], time.perf_counter() - started


def run_share(
    work: Path, share: float, files: int, prewarm: int, link: LinkSpec | None, readers: int = 0
) -> Result:
    """One spoke, one share: quiet misses, then misses during team-b's prewarm (or, with
    ``readers``, while team-b's pod reads its files through the mount with that many
    threads: demand, which no link share holds).

    Raises:
        deploy.local.StackError: the hub or spoke failed to start.
        httpx.HTTPError: the admin API failed.
    """
    publish(work / "hub", "team-a", _files(work / "a", files, 256 << 10), "--block-size", "65536")
    publish(
        work / "hub", "team-b", _files(work / "b", prewarm // MiB, MiB), "--block-size", "65536"
    )
    tenants = work / "tenants.yaml"
    tenants.write_text(  # the shares sum to at most 1
        f"team-a: {{datasets: [team-a], cache_share: 0.3, link_share: {min(0.5, 1 - share):g}}}\n"
        f"team-b: {{datasets: [team-b], cache_share: 0.3, link_share: {share}}}\n"
    )
    size = str(2 * (files * (256 << 10) + prewarm) + 64 * MiB)
    with LocalStack() as stack, ExitStack() as links:
        hub = stack.start_hub(work / "hub")
        if link is not None:
            hub = links.enter_context(WanProxy(parse_hostport(hub), link)).address
        admin = stack.start_spoke(
            hub,
            work / "cache",
            work / "mnt",
            size,
            extra=("--tenants", str(tenants), "--background-fill", "off"),
        )
        assert stack.spoke is not None
        reader = Reader(work / "mnt" / "team-a" / "latest", files)
        quiet = reader.read(count=QUIET_READS)
        done = threading.Event()
        with httpx.Client(base_url=admin, headers=admin_headers(work / "cache"), timeout=60) as c:
            cpu0 = tree_cpu_seconds(stack.spoke.pid)
            during: list[float] = []
            thread = threading.Thread(target=lambda: during.extend(reader.read(until=done)))
            if readers:
                thread.start()
                try:
                    nbytes, took = _read_all(
                        work / "mnt" / "team-b" / "latest", prewarm // MiB, readers
                    )
                finally:
                    done.set()
                    thread.join()
                job = {"state": "done", "bytes_done": nbytes, "elapsed_s": took}
            else:
                reply = c.post("/v1/prewarm", json={"dataset": "team-b", "ref": "latest"})
                reply.raise_for_status()
                job = reply.json()
                thread.start()
                try:
                    while job["state"] == "running":
                        time.sleep(0.1)
                        job = c.get(f"/v1/jobs/{job['id']}").json()
                finally:
                    done.set()
                    thread.join()
            cpu = tree_cpu_seconds(stack.spoke.pid) - cpu0
    (q50, q90), (d50, d90) = _quantiles(quiet), _quantiles(during or [float("nan")])
    fetched = int(job["bytes_done"]) + len(during) * (256 << 10)
    return Result(
        share=share,
        quiet_p50_ms=q50,
        quiet_p90_ms=q90,
        during_p50_ms=d50,
        during_p90_ms=d90,
        during_reads=len(during),
        prewarm_state=str(job["state"]),
        prewarm_mb_s=int(job["bytes_done"]) / float(job["elapsed_s"]) / 1e6,
        spoke_cpu_s_per_gib=cpu / (fetched / (1 << 30)),
    )


def markdown(results: list[Result], where: str, readers: int = 0) -> str:
    """The results as a markdown table."""
    what = f"{readers} readers" if readers else "prewarm"
    lines = [
        f"team-a's 256 KiB misses beside team-b's {what}, {where}",
        "",
        "| team-b link_share | team-a p50 quiet / during (ms) | ratio | p90 during (ms) "
        f"| reads during | team-b's {what} MB/s | spoke CPU s/GiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.share:g} | {r.quiet_p50_ms:.1f} / {r.during_p50_ms:.1f} | {r.ratio:.1f}x | "
            f"{r.during_p90_ms:.1f} | {r.during_reads} | {r.prewarm_mb_s:.1f} | "
            f"{r.spoke_cpu_s_per_gib:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point: run each share, print the table; exit 1 if a prewarm failed."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.tenant_link",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--shares", default="0.2,1", help="team-b's link_share values")
    parser.add_argument("--prewarm", default="320MiB", help="team-b's bytes (1 MiB files)")
    parser.add_argument("--files", type=int, default=600, help="team-a's 256 KiB files")
    parser.add_argument("--rtt-ms", type=float, default=0.0, help="0: the hub on loopback")
    parser.add_argument(
        "--readers", type=int, default=0, help="team-b reads its files with N threads (0: prewarm)"
    )
    parser.add_argument("--rate", default="1Gbit", help="the emulated link, each way")
    parser.add_argument("--json", type=Path, default=None)
    ns = parser.parse_args(argv)
    try:
        shares = [float(s) for s in ns.shares.split(",") if s.strip()]
        prewarm = parse_size(ns.prewarm)
        rate = parse_rate(ns.rate)
    except ValueError as err:
        parser.error(str(err))
    if not shares or any(not 0 < s <= 1 for s in shares):
        parser.error(f"--shares {ns.shares}: each must be above 0 and at most 1")
    if prewarm < MiB:
        parser.error(f"--prewarm {ns.prewarm}: at least 1MiB")
    if ns.files <= QUIET_READS:
        parser.error(f"--files {ns.files}: more than {QUIET_READS} (the quiet reads)")
    if ns.rtt_ms < 0:
        parser.error(f"--rtt-ms {ns.rtt_ms}: not negative")
    if not 0 <= ns.readers <= 1024:
        parser.error(f"--readers {ns.readers}: 0 (prewarm) to 1024")
    link = LinkSpec(ns.rtt_ms / 1000, rate) if ns.rtt_ms > 0 else None
    where = link.describe() if link is not None else "hub on loopback"
    base = Path(tempfile.mkdtemp(prefix="strata-tenant-link-"))
    results: list[Result] = []
    try:
        for n, share in enumerate(shares):
            print(f"team-b at link_share {share:g}, {where} …", flush=True)
            result = run_share(base / str(n), share, ns.files, prewarm, link, ns.readers)
            print(
                f"  team-a p50 {result.quiet_p50_ms:.1f} -> {result.during_p50_ms:.1f} ms; "
                f"prewarm {result.prewarm_state}, {result.prewarm_mb_s:.1f} MB/s",
                flush=True,
            )
            results.append(result)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print()
    print(markdown(results, where, ns.readers))
    if ns.json:
        rows = [{**asdict(r), "ratio": r.ratio} for r in results]
        ns.json.write_text(json.dumps({"where": where, "results": rows}, indent=2))
    return 0 if all(r.prewarm_state == "done" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
