"""A hinted cold start beside local disk and a filled cold start, in one run.

    python -m bench.hint_start [--size 384MiB] [--steps 100] [--rtt-ms 50] [--rate 1Gbit]
                               [--rows local,hints,fill] [--repeat 1]

The trainer rows of ``make bench`` that the hints target compares (``strata-train fit
--steps N --preset tiny --workers 2 --batch-size 8``), without the rest of the suite:

* **local**: the synthetic volume read from this node's disk;
* **hints**: a fresh spoke with an empty cache, its hub behind :mod:`bench.wan`, the
  trainer posting read-order hints (``--hints``);
* **fill**: the same with ``--background-fill auto`` and no hints.

Each row's time to first batch (the trainer's own, from the loop's start), the trainer's
wall time (the whole command, start-up and posting included), data-wait fraction and
the bytes that crossed the link. The page cache is dropped before each row when this
runs as root. Prints one line per run and a table; ``--json PATH`` writes the runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.data import default_cache_dir, ensure_dataset, parse_size
from bench.measure import LinkSampler, run_trainer
from bench.mounts import StrataMount
from bench.scenarios.base import DATASET
from bench.wan import LinkSpec, WanProxy, parse_hostport, parse_rate
from deploy.local import LocalStack, drop_page_cache, publish

ROWS = ("local", "hints", "fill")

FILL_FLAGS = ("--background-fill", "auto")
"""The fill row's spoke flags (the spoke's default since issue 25; said so the row does not
depend on it)."""


def _row(
    name: str, data_root: Path, work: Path, link: WanProxy, sampler: LinkSampler, ns: Any, n: int
) -> dict[str, Any]:
    drop_page_cache(3)
    out = work / "train" / f"{name}-{n}"
    if name == "local":
        run = run_trainer(data_root / "synth.mdio", out, ns.steps)
        return {"row": name, **run.to_dict(), "link_bytes": 0}
    flags = FILL_FLAGS if name == "fill" else ()
    cache_size = f"{2 * ns.size_bytes // 2**20 + 256}MiB"
    mount = StrataMount(
        link.address,
        work / "mnt",
        work / f"cache-{name}",
        cache_size,
        ("--log-level", "INFO", *flags),
    )
    with mount:
        root = mount.mount / DATASET / ns.version
        extra: tuple[str, ...] = ()
        if name == "hints":
            extra = ("--hints", mount.admin, "--hints-token-file", str(mount.token_file))
        t0 = sampler.mark()
        run = run_trainer(root / "synth.mdio", out, ns.steps, extra=extra)
        link_bytes = sampler.down_bytes(t0, sampler.mark())
    return {"row": name, **run.to_dict(), "link_bytes": link_bytes}


def main(argv: list[str] | None = None) -> int:
    """Run the rows; print each run and the medians."""
    p = argparse.ArgumentParser(prog="python -m bench.hint_start", description=__doc__)
    p.add_argument("--size", default="384MiB", help="synthetic volume size")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--rtt-ms", type=float, default=50.0)
    p.add_argument("--rate", default="1Gbit")
    p.add_argument("--rows", default=",".join(ROWS), help="comma-separated, of " + ",".join(ROWS))
    p.add_argument("--repeat", type=int, default=1, help="runs of each row, interleaved")
    p.add_argument("--cache-dir", type=Path, default=None, help="where data sets are kept")
    p.add_argument("--json", type=Path, default=None)
    ns = p.parse_args(argv)
    rows = [r for r in ns.rows.split(",") if r]
    if unknown := set(rows) - set(ROWS):
        p.error(f"unknown rows: {', '.join(sorted(unknown))}")
    ns.size_bytes = parse_size(ns.size)
    data = ensure_dataset(ns.cache_dir or default_cache_dir(), ns.size_bytes)
    spec = LinkSpec(rtt_s=ns.rtt_ms / 1000, rate_bps=parse_rate(ns.rate))
    runs: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="strata-hs-")))
        ns.version = publish(work / "hub", DATASET, data.root, "--tag", "latest")
        hub = stack.enter_context(LocalStack()).start_hub(work / "hub")
        link = stack.enter_context(WanProxy(parse_hostport(hub), spec))
        sampler = stack.enter_context(LinkSampler(link))
        for n in range(ns.repeat):
            for name in rows:
                run = _row(name, data.root, work, link, sampler, ns, n)
                runs.append(run)
                wait = 100 * run["data_wait_fraction"]
                print(
                    f"{name:6} first batch {run['time_to_first_batch_s']:5.2f} s  "
                    f"wall {run['wall_s']:5.1f} s  data wait {wait:4.1f} %  "
                    f"{run['samples_per_s']:5.1f} samples/s  "
                    f"link {run['link_bytes'] / 2**20:,.0f} MiB",
                    flush=True,
                )
    size = f"{data.bytes / 2**20:,.0f} MiB"
    print(f"\n| run | first batch | wall | data wait |  ({size}, {spec.describe()})")
    print("|---|---|---|---|")
    for name in rows:
        mine = [r for r in runs if r["row"] == name]
        first = statistics.median(r["time_to_first_batch_s"] for r in mine)
        wall = statistics.median(r["wall_s"] for r in mine)
        wait = statistics.median(r["data_wait_fraction"] for r in mine)
        print(f"| {name} | {first:.2f} s | {wall:.1f} s | {100 * wait:.1f} % |")
    if ns.json is not None:
        ns.json.write_text(json.dumps(runs, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
