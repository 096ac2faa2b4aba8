"""A region starting one job at the same second: N spokes started together on a cold
snapshot through the mesh, each node's reader reading the same first batch, then its own
shard.

    python -m bench.region_start [--spokes 8] [--size 128MiB] [--file-size 4MiB]
                                 [--first-batch 4] [--rtt-ms 50] [--rate 1Gbit]
                                 [--json FILE]

One hub behind :mod:`bench.wan` (default 50 ms RTT, 1 Gbit/s each way). First one spoke
alone (no mesh): started, its mount up, its reader reads the first ``--first-batch``
files (the batch every rank of a job reads first) and then the rest. Then ``--spokes``
spokes in one mesh (mTLS, a region token and read grants, as ``bench.mesh`` runs them),
every one started at the same moment from its own thread, each node's reader starting
as soon as its own mount is up (nobody waits for the mesh to form: a real node does not)
and reading the same first batch, then its shard (every N-th file). Reported, from the
common start: each node's mount-up and first-batch times against one spoke alone (the
issue's target: ≤ alone + 1 s; and the first batch after the node's own mount was up,
what a node with its own cores would see once started), its shard's end, WAN bytes over
the data set (≤ 1.05×), the hub's and the busiest spoke's CPU seconds and the hub's peak
RSS (process trees, ``/proc``), and what was refused: the hub's limit refusals, the
spokes' peer refusals and failed hub fetches.

All traffic stays on 127.0.0.1. Needs /dev/fuse. Every process of the run shares this
machine's cores, so on a small machine the N-spoke row measures contention too: say how
many cores the run had (the figures printed include ``os.cpu_count()`` and the load).
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
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.data import parse_size
from bench.rss import PeakSampler, _children
from bench.wan import LinkSpec, WanProxy, parse_hostport, parse_rate
from deploy.local import LocalStack, admin_headers, free_port, publish
from deploy.pki import region_flags

MiB = 1 << 20
WAN_TARGET = 1.05
FIRST_BATCH_SLACK_S = 1.0


@dataclass
class Node:
    """One node's reader: seconds from the common start, and what it read."""

    mount_s: float = 0.0
    first_batch_s: float = 0.0
    shard_s: float = 0.0
    read_bytes: int = 0
    cpu_s: float = 0.0
    peak_rss_mib: float = 0.0
    error: str = ""


@dataclass
class Run:
    """One start: one spoke alone, or N in a mesh."""

    spokes: int
    mesh: bool
    dataset_bytes: int
    wan_down_bytes: int
    hub_cpu_s: float
    hub_peak_rss_mib: float
    hub_refusals: float
    peer_refusals: float
    hub_fetch_errors: float
    nodes: list[Node] = field(default_factory=list)


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its live descendants (``/proc``)."""
    tree, todo, total = _children(), [pid], 0.0
    tick = os.sysconf("SC_CLK_TCK")
    while todo:
        current = todo.pop()
        todo.extend(tree.get(current, []))
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _pid_of(cache: Path) -> int:
    """The ``strata-spoke run`` process serving ``cache``."""
    needle = f"--cache-dir\0{cache}\0".encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if needle in cmdline and b"\0run\0" in cmdline:
                return int(entry)
    raise RuntimeError(f"no spoke process serves {cache}")


def _sum_metric(url: str, names: tuple[str, ...], cache: Path | None = None) -> float:
    """The samples ``names`` at ``url``'s ``/metrics``, summed (``cache``: a spoke's cache
    dir, whose token its admin port's ``/metrics`` needs)."""
    headers = admin_headers(cache) if cache is not None else None
    text = httpx.get(f"{url}/metrics", headers=headers, timeout=10).text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name in names
    )


def _read(paths: list[Path]) -> int:
    total = 0
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while chunk := f.read(MiB):
                total += len(chunk)
    return total


def run_once(
    work: Path, hub_dir: Path, names: list[str], n: int, mesh: bool, first: int, link: LinkSpec
) -> Run:
    """Start the hub behind the link, then ``n`` spokes at once; read; measure.

    Raises:
        deploy.local.StackError: the hub failed to start.
        RuntimeError: a spoke failed, or a reader read the wrong number of bytes.
    """
    ports = [free_port() for _ in range(n)]
    peers = ",".join(f"127.0.0.1:{p}" for p in ports)
    secured = region_flags(work / "region") if mesh else ()
    metrics = f"127.0.0.1:{free_port()}"
    file_bytes = int((hub_dir.parent / "file-bytes").read_text())
    size = file_bytes * len(names)
    cache_size = str(size + size // 4 + 64 * MiB)
    nodes = [Node() for _ in range(n)]
    admins: list[str] = [""] * n
    with LocalStack() as stack:
        hub = stack.start_hub(hub_dir, metrics=metrics, extra=("--insecure",) if mesh else ())
        assert stack.hub is not None
        hub_pid = stack.hub.pid
        with WanProxy(parse_hostport(hub), link) as wan:
            before = wan.stats().down_bytes
            hub_cpu = tree_cpu_s(hub_pid)
            barrier = threading.Barrier(n)
            t0 = [0.0]

            def node(i: int) -> None:
                extra = (
                    ("--peer-listen", f"127.0.0.1:{ports[i]}", "--peers", peers, *secured)
                    if mesh
                    else ()
                )
                barrier.wait()
                if i == 0:
                    t0[0] = time.monotonic()
                start = time.monotonic()
                try:
                    admins[i] = stack.start_spoke(
                        wan.address, work / f"cache{i}", work / f"mnt{i}", cache_size, extra=extra
                    )
                    nodes[i].mount_s = time.monotonic() - start
                    root = work / f"mnt{i}" / "bench" / "v1"
                    batch = [root / name for name in names[:first]]
                    shard = [root / name for name in names[first:][i::n]]
                    nodes[i].read_bytes = _read(batch)
                    nodes[i].first_batch_s = time.monotonic() - start
                    nodes[i].read_bytes += _read(shard)
                    nodes[i].shard_s = time.monotonic() - start
                except Exception as err:  # reported per node, the run goes on
                    nodes[i].error = f"{type(err).__name__}: {err}"

            with PeakSampler({"hub": hub_pid}, period=0.1) as hub_peak:
                threads = [threading.Thread(target=node, args=(i,)) for i in range(n)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
            down = wan.stats().down_bytes - before
            hub_cpu = tree_cpu_s(hub_pid) - hub_cpu
            for i in range(n):
                if admins[i]:
                    pid = _pid_of(work / f"cache{i}")
                    nodes[i].cpu_s = round(tree_cpu_s(pid), 2)
            hub_refusals = _sum_metric(f"http://{metrics}", ("strata_hub_limit_refusals_total",))
            peer_names = (
                "strata_spoke_peer_refusals_total",
                "strata_spoke_peer_refused_blocks_total",
            )
            caches = [work / f"cache{i}" for i in range(n)]
            peer_refusals = sum(
                _sum_metric(a, peer_names, c) for a, c in zip(admins, caches, strict=True) if a
            )
            fetch_errors = sum(
                _sum_metric(a, ("strata_spoke_hub_fetch_errors_total",), c)
                for a, c in zip(admins, caches, strict=True)
                if a
            )
    for i, record in enumerate(nodes):
        if not record.error and record.read_bytes != file_bytes * (
            first + len(names[first:][i::n])
        ):
            record.error = f"read {record.read_bytes} bytes"
    return Run(
        n,
        mesh,
        size,
        down,
        round(hub_cpu, 2),
        round(hub_peak.peak["hub"] / MiB, 1),
        hub_refusals,
        peer_refusals,
        fetch_errors,
        nodes,
    )


def markdown(alone: Run, region: Run, link: LinkSpec) -> str:
    """The region's nodes against one spoke alone, with the issue's targets."""
    target = alone.nodes[0].first_batch_s + FIRST_BATCH_SLACK_S
    lines = [
        f"A region starting at once over {link.describe()} ({os.cpu_count()} cores, load "
        f"{os.getloadavg()[0]:.1f}): first batch target ≤ one spoke alone + "
        f"{FIRST_BATCH_SLACK_S:g} s = {target:.2f} s; WAN ≤ {WAN_TARGET}× the data set",
        "",
        "| run | node | mount up s | first batch s | after mount up s | shard done s | CPU s "
        "| error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in (alone, region):
        label = f"{run.spokes} {'in a mesh' if run.mesh else 'alone'}"
        for i, node in enumerate(run.nodes):
            lines.append(
                f"| {label} | {i} | {node.mount_s:.2f} | {node.first_batch_s:.2f} | "
                f"{node.first_batch_s - node.mount_s:.2f} | {node.shard_s:.2f} | "
                f"{node.cpu_s:.1f} | {node.error or '—'} |"
            )
    lines += [
        "",
        "| run | WAN / data set | hub CPU s | hub peak RSS MiB | busiest spoke CPU s | "
        "slowest first batch s | hub refusals | peer refusals | failed hub fetches |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in (alone, region):
        lines.append(
            f"| {run.spokes} {'in a mesh' if run.mesh else 'alone'} | "
            f"{run.wan_down_bytes / run.dataset_bytes:.2f}× | {run.hub_cpu_s:.1f} | "
            f"{run.hub_peak_rss_mib:.0f} | {max(n.cpu_s for n in run.nodes):.1f} | "
            f"{max(n.first_batch_s for n in run.nodes):.2f} | {run.hub_refusals:.0f} | "
            f"{run.peer_refusals:.0f} | {run.hub_fetch_errors:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point: one spoke alone, then N in a mesh; print the tables; 1 if a node failed."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.region_start",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--spokes", type=int, default=8, help="nodes started together")
    parser.add_argument("--size", default="128MiB", help="bytes of the data set")
    parser.add_argument("--file-size", default="4MiB")
    parser.add_argument("--first-batch", type=int, default=4, help="files every node reads first")
    parser.add_argument("--rtt-ms", type=float, default=50.0)
    parser.add_argument("--rate", default="1Gbit", help="link capacity each way")
    parser.add_argument("--json", type=Path, default=None)
    ns = parser.parse_args(argv)
    try:
        size, file_bytes = parse_size(ns.size), parse_size(ns.file_size)
        link = LinkSpec(ns.rtt_ms / 1000, parse_rate(ns.rate))
    except ValueError as err:
        parser.error(str(err))
    if not 1 <= ns.spokes <= 32:
        parser.error("--spokes: between 1 and 32")
    files = size // file_bytes if file_bytes > 0 else 0
    if files < ns.first_batch + ns.spokes or ns.first_batch < 1:
        parser.error("--size must hold --first-batch files and one more for every spoke")
    base = Path(tempfile.mkdtemp(prefix="strata-region-start-"))
    try:
        src = base / "src"
        src.mkdir()
        names = [f"f{i:05d}.bin" for i in range(files)]
        for name in names:
            (src / name).write_bytes(os.urandom(file_bytes))
        publish(base / "hub", "bench", src)
        (base / "file-bytes").write_text(str(file_bytes))
        shutil.rmtree(src)
        runs = []
        for n, mesh in ((1, False), (ns.spokes, True)):
            print(
                f"{n} spoke(s), {'mesh' if mesh else 'alone'}: "
                f"{files * file_bytes / MiB:,.0f} MiB …"
            )
            work = base / f"run-{n}-{int(mesh)}"
            work.mkdir()
            runs.append(run_once(work, base / "hub", names, n, mesh, ns.first_batch, link))
            shutil.rmtree(work, ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    alone, region = runs
    print()
    print(markdown(alone, region, link))
    if ns.json:
        ns.json.write_text(
            json.dumps({"link": link.describe(), "runs": [asdict(r) for r in runs]}, indent=2)
        )
    return 1 if any(node.error for run in runs for node in run.nodes) else 0


if __name__ == "__main__":
    sys.exit(main())
