"""Prewarm over an emulated WAN: how much of the link a prewarm job uses.

    python -m bench.prewarm_link [--size 1GiB] [--rtt-ms 50] [--rate 1Gbit]
                                 [--only chunks,large,small] [--json FILE]

For each shape of data set, one run: publish random bytes to a local hub, put the hub
behind :mod:`bench.wan` (default 50 ms RTT, 1 Gbit/s each way), start a spoke with an
empty cache that reaches the hub only through the link, ``POST /v1/prewarm`` everything,
and poll ``GET /v1/jobs/{id}`` until the job ends. Link use is the bytes that came down
the link from the POST to the job's end over what the link could carry in that time
(:func:`bench.measure.link_utilisation`), so the job's start-up (resolving the ref, the
manifest) counts against it. The issue's target is ≥ 80 % at 50 ms / 1 Gbit/s.

Shapes (``--size`` bytes each):

* ``chunks``: 1 MiB files, one block each: a Zarr/MDIO store's chunk files (the data set
  ``bench.run`` uses);
* ``large``: 64 MiB files in 4 MiB blocks (the default block size);
* ``small``: 64 KiB files, one block each; per-block costs dominate here.

All traffic stays on 127.0.0.1. Needs /dev/fuse (the spoke starts its mount).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from bench.data import parse_size
from bench.measure import LinkSampler, link_utilisation, tree_cpu_seconds
from bench.wan import LinkSpec, WanProxy, format_rate, parse_hostport, parse_rate
from deploy.local import LocalStack, admin_headers, publish

TARGET = 0.80
"""Link use a prewarm must reach (issue: 50 ms RTT, 1 Gbit/s)."""

MiB = 1 << 20


@dataclass(frozen=True)
class Shape:
    """A data set's shape: file size and block size, bytes."""

    name: str
    file_bytes: int
    block_bytes: int
    what: str


SHAPES = {
    s.name: s
    for s in (
        Shape("chunks", 1 * MiB, 4 * MiB, "1 MiB chunk files"),
        Shape("large", 64 * MiB, 4 * MiB, "64 MiB files, 4 MiB blocks"),
        Shape("small", 64 * 1024, 4 * MiB, "64 KiB files"),
    )
}


@dataclass
class Result:
    """One prewarm over the link."""

    shape: str
    what: str
    files: int
    blocks: int
    bytes_total: int
    state: str
    seconds: float
    mb_s: float
    link_down_bytes: int
    link_utilisation: float
    job_rate_mb_s: float
    bins_mb_s: list[float]
    hub_cpu_s: float
    spoke_cpu_s: float

    @property
    def met(self) -> bool:
        """Whether the job finished and used at least :data:`TARGET` of the link."""
        return self.state == "done" and self.link_utilisation >= TARGET


def make_source(root: Path, shape: Shape, size: int) -> int:
    """Write ``size`` bytes of random files of ``shape`` under ``root/data``; returns files."""
    data = root / "data"
    data.mkdir(parents=True)
    files = max(1, size // shape.file_bytes)
    for i in range(files):
        (data / f"f{i:06d}.bin").write_bytes(os.urandom(shape.file_bytes))
    return files


def prewarm_once(work: Path, shape: Shape, size: int, link: LinkSpec) -> Result:
    """Publish, serve behind the link, prewarm everything and measure.

    Raises:
        deploy.local.StackError: the hub or spoke failed to start.
        httpx.HTTPError: the admin API failed.
    """
    files = make_source(work / "src", shape, size)
    publish(work / "hub", "bench", work / "src", "--block-size", str(shape.block_bytes))
    shutil.rmtree(work / "src")
    cache_size = str(size + size // 4 + 64 * MiB)  # everything fits
    with LocalStack() as stack:
        hub = stack.start_hub(work / "hub")
        with WanProxy(parse_hostport(hub), link) as wan, LinkSampler(wan) as sampler:
            admin = stack.start_spoke(wan.address, work / "cache", work / "mnt", cache_size)
            assert stack.hub is not None and stack.spoke is not None
            auth = admin_headers(work / "cache")  # the token the spoke generated
            with httpx.Client(base_url=admin, headers=auth, timeout=60) as client:
                cpu0 = tree_cpu_seconds(stack.hub.pid), tree_cpu_seconds(stack.spoke.pid)
                t0 = sampler.mark()
                reply = client.post("/v1/prewarm", json={"dataset": "bench", "ref": "latest"})
                reply.raise_for_status()
                job = reply.json()
                while job["state"] == "running":
                    time.sleep(0.05)
                    job = client.get(f"/v1/jobs/{job['id']}").json()
                t1 = sampler.mark()
                cpu1 = tree_cpu_seconds(stack.hub.pid), tree_cpu_seconds(stack.spoke.pid)
    down = sampler.down_bytes(t0, t1)
    return Result(
        shape=shape.name,
        what=shape.what,
        files=files,
        blocks=int(job["blocks"]),
        bytes_total=int(job["bytes_total"]),
        state=str(job["state"]) + (f" ({job['error']})" if job.get("error") else ""),
        seconds=t1 - t0,
        mb_s=int(job["bytes_done"]) / (t1 - t0) / 1e6,
        link_down_bytes=down,
        link_utilisation=link_utilisation(down, t1 - t0, link.rate_bps),
        job_rate_mb_s=float(job["rate_bytes_per_s"]) / 1e6,
        bins_mb_s=sampler.bins_mb_s(t0, t1),
        hub_cpu_s=cpu1[0] - cpu0[0],
        spoke_cpu_s=cpu1[1] - cpu0[1],
    )


def markdown(results: list[Result], link: LinkSpec) -> str:
    """The results as a markdown table."""
    lines = [
        f"Prewarm over {link.describe()} (target: link use ≥ {TARGET:.0%})",
        "",
        "| data | files | blocks | MiB | seconds | MB/s | link use | target | CPU s hub / spoke |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.what} | {r.files:,} | {r.blocks:,} | {r.bytes_total / MiB:,.0f} | "
            f"{r.seconds:.1f} | {r.mb_s:.1f} | {r.link_utilisation:.1%} | "
            f"{'met' if r.met else 'missed'} | {r.hub_cpu_s:.1f} / {r.spoke_cpu_s:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the shapes, print the table; exit 0 unless a run failed (with
    ``--strict``, also 1 when a shape misses the target)."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.prewarm_link",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--size", default="1GiB", help="bytes per data set, e.g. 512MiB")
    parser.add_argument("--rtt-ms", type=float, default=50.0)
    parser.add_argument("--rate", default="1Gbit", help="link capacity each way")
    parser.add_argument("--only", default=",".join(SHAPES), help="shapes, comma-separated")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--work", type=Path, default=None, help="scratch dir (default: temp)")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    ns = parser.parse_args(argv)
    try:
        size = parse_size(ns.size)
        link = LinkSpec(ns.rtt_ms / 1000, parse_rate(ns.rate))
    except ValueError as err:
        parser.error(str(err))
    if ns.work is not None and not ns.work.is_dir():
        parser.error(f"--work {ns.work} is not a directory")
    names = [n.strip() for n in ns.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in SHAPES]
    if unknown or not names:
        parser.error(f"--only: unknown shape {unknown or names}; choose from {', '.join(SHAPES)}")
    too_small = [n for n in names if size < SHAPES[n].file_bytes]
    if too_small:
        parser.error(f"--size {ns.size} is smaller than one file of {', '.join(too_small)}")
    base = Path(tempfile.mkdtemp(prefix="strata-prewarm-", dir=ns.work))
    results: list[Result] = []
    try:
        for name in names:
            print(f"{SHAPES[name].what}: {size / MiB:,.0f} MiB over {link.describe()} …")
            result = prewarm_once(base / name, SHAPES[name], size, link)
            print(
                f"  {result.state}: {result.mb_s:.1f} MB/s, link use "
                f"{result.link_utilisation:.1%} ({format_rate(round(result.mb_s * 8, 1) * 1e6)})"
            )
            results.append(result)
            shutil.rmtree(base / name, ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print()
    print(markdown(results, link))
    if ns.json:
        rows = [{**asdict(r), "met": r.met} for r in results]
        ns.json.write_text(json.dumps({"link": link.describe(), "results": rows}, indent=2))
    if not all(r.state == "done" for r in results):
        return 1
    return 1 if ns.strict and not all(r.met for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
