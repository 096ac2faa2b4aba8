"""``strata-demo``: the whole system on one machine, on the real F3 seismic volume.

1. convert ``f3.sgy`` (SEG-Y) to MDIO with ``strata-train prepare``;
2. publish it to a local hub as dataset ``f3`` (tag ``latest``) and serve it on 127.0.0.1;
3. start a spoke (daemon + FUSE mount) with an empty cache, prewarming nothing;
4. train the tiny 3D ViT-MAE for a few hundred steps reading ``MOUNT/f3/latest/f3.mdio``;
5. train a short second pass on the now-warm cache (after dropping the kernel page cache
   when running as root, so the reads really reach the mount) to show hits and no new
   hub bytes;
6. print a summary: hub bytes fetched, cache hits and misses, samples/s, data-wait
   fraction, loss first → last.

Everything is cleaned up (unmount, processes, temporary directory) on success, on error
and on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

from deploy.local import LocalStack, StackError, drop_page_cache
from trainer.command import fit_args

REPO_ROOT = Path(__file__).resolve().parent.parent


def default_segy() -> Path:
    """``$STRATA_SEISMIC_DIR/f3.sgy``, else ``<repo>/../shared/data/seismic/f3.sgy``."""
    env = os.environ.get("STRATA_SEISMIC_DIR")
    base = Path(env) if env else REPO_ROOT.parent / "shared" / "data" / "seismic"
    return base / "f3.sgy"


class DemoError(Exception):
    """A step of the demo failed; the message names the step."""


def _run(step: str, args: list[str], capture: bool = False) -> str:
    print(f"==> {step}", flush=True)
    proc = subprocess.run(
        [sys.executable, "-m", *args], text=True, stdout=subprocess.PIPE if capture else None
    )
    if proc.returncode != 0:
        raise DemoError(f"{step} failed (exit {proc.returncode})")
    return proc.stdout or ""


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def cache_stats(admin_url: str) -> dict[str, Any]:
    """The spoke's ``GET /v1/cache``."""
    reply = httpx.get(f"{admin_url}/v1/cache", timeout=10.0)
    reply.raise_for_status()
    stats: dict[str, Any] = reply.json()
    return stats


def wait_for_hits(admin_url: str, above: int, timeout: float = 3.0) -> dict[str, Any]:
    """Cache stats once the mount's batched hit reports (every 0.1 s or 64 hits) have arrived."""
    deadline = time.monotonic() + timeout
    stats = cache_stats(admin_url)
    while stats["hits"] <= above and time.monotonic() < deadline:
        time.sleep(0.2)
        stats = cache_stats(admin_url)
    return stats


def _fit(data: Path, out: Path, steps: int, batch_size: int, workers: int) -> None:
    _run(
        f"train tiny 3D ViT-MAE for {steps} steps through the mount",
        fit_args(data, out, steps, batch_size=batch_size, workers=workers),
    )


def run_demo(
    work: Path,
    segy: Path,
    steps: int,
    batch_size: int,
    workers: int,
    cache_size: str,
    second_pass_steps: int = 50,
) -> dict[str, Any]:
    """Run every step in ``work``; returns the summary (also printed).

    Raises:
        DemoError, StackError: a step failed.
    """
    src = work / "src"
    src.mkdir(parents=True)
    _run(
        "convert SEG-Y to MDIO",
        ["trainer", "prepare", "--segy", str(segy), "--out", str(src / "f3.mdio")],
    )
    version = _run(
        "publish to the hub as dataset f3",
        ["hub", "publish", "--data-dir", str(work / "hub"), "f3", str(src), "--tag", "latest"],
        capture=True,
    ).strip()
    with LocalStack() as stack:
        print("==> start hub and spoke (empty cache, nothing prewarmed)", flush=True)
        hub = stack.start_hub(work / "hub")
        admin = stack.start_spoke(hub, work / "cache", work / "mnt", cache_size)
        data = work / "mnt" / "f3" / "latest" / "f3.mdio"
        print(f"    hub {hub}, admin {admin}, reading {data}", flush=True)
        started = time.monotonic()
        _fit(data, work / "train", steps, batch_size, workers)
        train_s = time.monotonic() - started
        stats = wait_for_hits(admin, above=-1, timeout=1.0)
        second: dict[str, Any] = {}
        if second_pass_steps > 0:
            dropped = drop_page_cache()
            _fit(data, work / "train2", second_pass_steps, batch_size, workers)
            after = wait_for_hits(admin, above=stats["hits"]) if dropped else cache_stats(admin)
            second = {
                "steps": second_pass_steps,
                "page_cache_dropped": dropped,
                "new_hub_bytes": after["hub_fetch_bytes"] - stats["hub_fetch_bytes"],
                "cache_hits": after["hits"] - stats["hits"],
                "cache_misses": after["misses"] - stats["misses"],
            }
    train = json.loads((work / "train" / "summary.json").read_text())
    summary = {
        "dataset": f"f3@latest ({version})",
        "hub_bytes_fetched": stats["hub_fetch_bytes"],
        "cache_hits": stats["hits"],
        "cache_misses": stats["misses"],
        "cache_hit_ratio": round(stats["hit_ratio"], 4),
        "cache_used_bytes": stats["used_bytes"],
        "steps": train["steps"],
        "samples_per_s": round(train["samples_per_s"], 2),
        "data_wait_fraction": round(train["data_wait_fraction"], 4),
        "loss_first": round(train["loss_first"], 4),
        "loss_last": round(train["loss_last"], 4),
        "train_wall_s": round(train_s, 1),
        "second_pass": second,
    }
    print("\n== Strata demo summary (first pass: cold cache) ==")
    print(f"  dataset            {summary['dataset']}")
    print(f"  hub bytes fetched  {summary['hub_bytes_fetched']:,}")
    print(
        f"  cache hits/misses  {summary['cache_hits']:,} / {summary['cache_misses']:,}"
        f"  (hit ratio {summary['cache_hit_ratio']:.3f})"
    )
    print(
        f"  training           {summary['steps']} steps, "
        f"{summary['samples_per_s']:.1f} samples/s, "
        f"data-wait fraction {summary['data_wait_fraction']:.3f}"
    )
    print(f"  loss               {summary['loss_first']:.4f} -> {summary['loss_last']:.4f}")
    if second:
        how = (
            "kernel page cache dropped"
            if second["page_cache_dropped"]
            else "kernel page cache kept: not root"
        )
        print(
            f"  second pass        {second['steps']} steps ({how}): "
            f"{second['new_hub_bytes']:,} new hub bytes, cache hits/misses "
            f"{second['cache_hits']:,} / {second['cache_misses']:,}"
        )
    return summary


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="strata-demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--segy", type=Path, default=None, help="SEG-Y file (default: F3)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cache-size", default="1GiB")
    parser.add_argument(
        "--second-pass-steps",
        type=int,
        default=50,
        help="steps of the warm second pass (0 skips it)",
    )
    parser.add_argument(
        "--work",
        type=Path,
        default=None,
        help="working directory (default: a new temporary one, removed after)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the summary here")
    ns = parser.parse_args(argv)
    segy: Path = ns.segy or default_segy()
    if not segy.is_file():
        print(
            f"strata-demo: error: SEG-Y file {segy} not found "
            "(set STRATA_SEISMIC_DIR or pass --segy)",
            file=sys.stderr,
        )
        return 2
    signal.signal(signal.SIGTERM, _raise_interrupt)
    work = ns.work or Path(tempfile.mkdtemp(prefix="strata-demo-"))
    if ns.work is not None and work.exists() and any(work.iterdir()):
        print(f"strata-demo: error: --work {work} is not empty", file=sys.stderr)
        return 2
    try:
        summary = run_demo(
            work, segy, ns.steps, ns.batch_size, ns.workers, ns.cache_size, ns.second_pass_steps
        )
        if ns.json:
            ns.json.write_text(json.dumps(summary, indent=2) + "\n")
        return 0
    except (DemoError, StackError, httpx.HTTPError) as err:
        print(f"strata-demo: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("strata-demo: interrupted; cleaned up", file=sys.stderr)
        return 130
    finally:
        if ns.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
