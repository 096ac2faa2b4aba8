"""The regional mesh over an emulated WAN: N spokes read the whole data set cold.

    python -m bench.mesh [--size 256MiB] [--spokes 1,2,4] [--rtt-ms 50] [--rate 1Gbit]
                         [--block-size 4MiB] [--file-size 8MiB] [--mesh-only] [--json FILE]

One hub behind :mod:`bench.wan` (default 50 ms RTT, 1 Gbit/s each way); for each N, two
runs: N spokes in one mesh (``--peer-listen``/``--peers``, mTLS with a region token and
read grants, as a real region runs) and N independent spokes. Each
spoke has its own cache directory and kernel mount, and every spoke reads every file
through its mount at once, cold. Reported: bytes that crossed the WAN over the data set
(the issue's target: ≤ 1.05× with the mesh, N× without), each spoke's cold-pass time
(slowest and mean, and the slowest over one spoke alone: target ≤ 1.2× with the mesh),
and link use (WAN bytes over what the link carries in the slowest pass), and with the
mesh what went through relays (blocks owners sent to a relay instead, blocks relays
served: with 10 spokes or more every block of the data set is hot, spoke/mesh/relay.py)
and the peer calls refused. ``--mesh-only``: one spoke alone, then the meshes only.

All traffic stays on 127.0.0.1. Needs /dev/fuse.
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
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.data import parse_size
from bench.measure import link_utilisation
from bench.wan import LinkSpec, WanProxy, parse_hostport, parse_rate
from deploy.local import LocalStack, admin_headers, free_port, publish
from deploy.pki import region_flags

MiB = 1 << 20
WAN_TARGET = 1.05
PASS_TARGET = 1.2


@dataclass
class Result:
    """One run: N spokes, in a mesh or independent."""

    spokes: int
    mesh: bool
    dataset_bytes: int
    wan_down_bytes: int
    pass_s: list[float]
    link_use: float
    peer_bytes: int
    relay_redirected_blocks: int = 0
    relay_served_blocks: int = 0
    peer_refusals: int = 0

    @property
    def wan_ratio(self) -> float:
        """WAN bytes over the data set."""
        return self.wan_down_bytes / self.dataset_bytes


def _read_tree(root: Path) -> int:
    total = 0
    for path in sorted(root.rglob("*.bin")):
        with open(path, "rb", buffering=0) as f:
            while chunk := f.read(MiB):
                total += len(chunk)
    return total


def _wait_live(admin: str, cache: Path, count: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    auth = admin_headers(cache)

    def ready() -> bool:
        mesh = httpx.get(f"{admin}/v1/cache", headers=auth, timeout=10).json()["mesh"]
        return bool(mesh["nodes_live"] == count and mesh["grant"]["valid"])

    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{admin}: the mesh did not reach {count} live, granted spokes")
        time.sleep(0.1)


def _metric(admin: str, cache: Path, name: str, source: str | None = None) -> float:
    """A spoke's samples of ``name`` (of ``source``; None: every label), summed (the admin
    port's ``/metrics``, with the node's token from ``cache``)."""
    text = httpx.get(f"{admin}/metrics", headers=admin_headers(cache), timeout=10).text
    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name and (source is None or s.labels.get("source") == source)
    )


def run_once(work: Path, hub_dir: Path, n: int, mesh: bool, size: int, link: LinkSpec) -> Result:
    """Start the hub behind the link and ``n`` spokes, read everything everywhere, measure.

    Raises:
        deploy.local.StackError: a process failed to start.
        RuntimeError: the mesh did not form, or a reader read the wrong number of bytes.
    """
    cache_size = str(size + size // 4 + 64 * MiB)
    ports = [free_port() for _ in range(n)]
    peers = ",".join(f"127.0.0.1:{p}" for p in ports)
    secured = region_flags(work / "region") if mesh else ()
    with LocalStack() as stack:
        # plaintext on loopback: read grants for the mesh need --insecure then
        hub = stack.start_hub(hub_dir, extra=("--insecure",) if mesh else ())
        with WanProxy(parse_hostport(hub), link) as wan:
            admins = []
            for i, port in enumerate(ports):
                extra = (
                    ("--peer-listen", f"127.0.0.1:{port}", "--peers", peers, *secured)
                    if mesh
                    else ()
                )
                admins.append(
                    stack.start_spoke(
                        wan.address,
                        work / f"cache{i}",
                        work / f"mnt{i}",
                        cache_size,
                        extra=extra,
                    )
                )
            if mesh:
                for i, admin in enumerate(admins):
                    _wait_live(admin, work / f"cache{i}", n)
            roots = [work / f"mnt{i}" / "bench" / "v1" for i in range(n)]
            for root in roots:  # the listing, not the data: outside the timed pass
                sum(1 for _ in root.rglob("*.bin"))
            before = wan.stats().down_bytes
            times: list[float] = [0.0] * n
            sizes: list[int] = [0] * n
            barrier = threading.Barrier(n)

            def read(i: int) -> None:
                barrier.wait()
                t0 = time.monotonic()
                sizes[i] = _read_tree(roots[i])
                times[i] = time.monotonic() - t0

            threads = [threading.Thread(target=read, args=(i,)) for i in range(n)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            down = wan.stats().down_bytes - before
            caches = [work / f"cache{i}" for i in range(n)]
            peer = sum(
                int(_metric(a, c, "strata_spoke_source_bytes_total", "peer"))
                for a, c in zip(admins, caches, strict=True)
            )
            relay = {
                name: sum(
                    int(_metric(a, c, f"strata_spoke_{name}_total"))
                    for a, c in zip(admins, caches, strict=True)
                )
                for name in (
                    "mesh_relay_redirected_blocks",
                    "mesh_relay_served_blocks",
                    "peer_refusals",
                )
            }
    if any(s != size for s in sizes):
        raise RuntimeError(f"readers read {sizes} bytes, the data set has {size}")
    return Result(
        n,
        mesh,
        size,
        down,
        times,
        link_utilisation(down, max(times), link.rate_bps),
        peer,
        relay["mesh_relay_redirected_blocks"],
        relay["mesh_relay_served_blocks"],
        relay["peer_refusals"],
    )


def markdown(results: list[Result], link: LinkSpec) -> str:
    """Side by side: the mesh and independent spokes for each N."""
    alone = next((max(r.pass_s) for r in results if r.spokes == 1 and not r.mesh), None)
    lines = [
        f"Regional mesh over {link.describe()}: every spoke reads the whole data set cold "
        f"(targets with the mesh: WAN ≤ {WAN_TARGET}× the data set, slowest pass ≤ "
        f"{PASS_TARGET}× one spoke alone)",
        "",
        "| spokes | mode | WAN bytes / data set | slowest pass s | mean pass s | "
        "slowest / one alone | link use | peer MiB | sent to relays / served by relays "
        "(blocks) | refused calls |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        slow = max(r.pass_s)
        ratio = f"{slow / alone:.2f}×" if alone else "—"
        lines.append(
            f"| {r.spokes} | {'mesh' if r.mesh else 'independent'} | {r.wan_ratio:.2f}× | "
            f"{slow:.1f} | {sum(r.pass_s) / len(r.pass_s):.1f} | {ratio} | {r.link_use:.0%} | "
            f"{r.peer_bytes / MiB:,.0f} | {r.relay_redirected_blocks:,} / "
            f"{r.relay_served_blocks:,} | {r.peer_refusals:,} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point: every N, mesh and independent; print the table; exit 1 if a run failed."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.mesh",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--size", default="256MiB", help="bytes of the data set, e.g. 64MiB")
    parser.add_argument("--spokes", default="1,2,4", help="N values, comma-separated")
    parser.add_argument("--rtt-ms", type=float, default=50.0)
    parser.add_argument("--rate", default="1Gbit", help="link capacity each way")
    parser.add_argument("--block-size", default="4MiB")
    parser.add_argument("--file-size", default="8MiB")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--work", type=Path, default=None, help="scratch dir (default: temp)")
    parser.add_argument(
        "--mesh-only", action="store_true", help="no independent spokes beyond one alone"
    )
    ns = parser.parse_args(argv)
    try:
        size, block, file_bytes = (
            parse_size(ns.size),
            parse_size(ns.block_size),
            parse_size(ns.file_size),
        )
        link = LinkSpec(ns.rtt_ms / 1000, parse_rate(ns.rate))
        counts = [int(x) for x in ns.spokes.split(",") if x.strip()]
    except ValueError as err:
        parser.error(str(err))
    if not counts or any(c < 1 or c > 16 for c in counts):
        parser.error("--spokes: N values between 1 and 16, e.g. 1,2,4")
    if size < file_bytes or file_bytes <= 0 or block <= 0:
        parser.error("--size must hold at least one --file-size file; sizes must be positive")
    if ns.work is not None and not ns.work.is_dir():
        parser.error(f"--work {ns.work} is not a directory")
    base = Path(tempfile.mkdtemp(prefix="strata-mesh-", dir=ns.work))
    results: list[Result] = []
    try:
        src = base / "src"
        src.mkdir()
        files = size // file_bytes
        for i in range(files):
            (src / f"f{i:05d}.bin").write_bytes(os.urandom(file_bytes))
        size = files * file_bytes
        publish(base / "hub", "bench", src, "--block-size", str(block))
        shutil.rmtree(src)
        runs = [(1, False)] + [
            (n, m)
            for n in counts
            for m in (True, False)
            if (n, m) != (1, False) and (m or not ns.mesh_only)
        ]
        for n, mesh in runs:
            print(f"{n} spokes, {'mesh' if mesh else 'independent'}: {size / MiB:,.0f} MiB …")
            work = base / f"run-{n}-{int(mesh)}"
            work.mkdir()
            result = run_once(work, base / "hub", n, mesh, size, link)
            print(f"  WAN {result.wan_ratio:.2f}× the data set, passes {result.pass_s}")
            results.append(result)
            shutil.rmtree(work, ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print()
    print(markdown(results, link))
    if ns.json:
        ns.json.write_text(
            json.dumps(
                {
                    "link": link.describe(),
                    "rtt_s": link.rtt_s,
                    "rate_bps": link.rate_bps,
                    "results": [asdict(r) for r in results],
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
