"""``strata-demo``: the whole system on one machine, behind an emulated WAN.

1. convert ``f3.sgy`` (the real F3 seismic volume, SEG-Y) to MDIO with
   ``strata-train prepare`` while a synthetic volume large enough for a cold start to
   show is written beside it (``strata-train synth``, ``--synth-shape``: 256 MiB of 1 MiB
   chunk files by default; F3 itself is 120 KiB, one round trip of link time);
2. publish both to a local hub as dataset ``f3`` (tag ``latest``), and put the hub behind
   the WAN emulator (:mod:`bench.wan`: 50 ms RTT, 100 Mbit/s unless told otherwise, so the
   synthetic volume takes about 20 s to cross: longer than the trainer takes to start);
3. start a spoke (daemon + FUSE mount) with an empty cache, prewarming nothing: it
   reaches the hub only through the link (``--background-fill`` passes the spoke's
   option on; ``auto`` by default, as in the spoke: once a snapshot is read, the rest of
   it is fetched at the lowest priority);
4. train the tiny 3D ViT-MAE reading ``MOUNT/f3/latest/f3.mdio`` (and, with
   ``--second-pass-steps``, a second pass on the warm cache);
5. train two epochs on the synthetic volume through a fresh spoke (empty cache: epoch 0
   waits for the link, epoch 1 reads the cache), then the same two epochs straight from
   a SeaweedFS bucket behind the same kind of link (``s3://demo/synth.mdio`` through
   s3fs, :mod:`demo.epochs`; ``--no-direct`` leaves it out), and print them side by side
   per epoch: wall time, samples/s, bytes over the link, cache misses and hits;
6. write ``demo-timeline.png``: samples/s and link MB/s per 1 s of both runs, one time
   axis.

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

from bench.measure import LinkSampler, TrainerError
from bench.seaweed import SeaweedError
from bench.wan import LinkSpec, WanProxy, parse_hostport, parse_rate
from demo.epochs import bucket, direct_missing, timeline_png, two_epochs
from deploy.local import LocalStack, StackError, admin_headers, drop_page_cache
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


def cache_stats(admin_url: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """The spoke's ``GET /v1/cache`` (``headers``: its admin token, :func:`admin_headers`)."""
    reply = httpx.get(f"{admin_url}/v1/cache", headers=headers, timeout=10.0)
    reply.raise_for_status()
    stats: dict[str, Any] = reply.json()
    return stats


def wait_for_hits(
    admin_url: str, above: int, timeout: float = 3.0, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """Cache stats once the mount's batched hit reports (every 0.1 s or 1,024 hits) have arrived."""
    deadline = time.monotonic() + timeout
    stats = cache_stats(admin_url, headers)
    while stats["hits"] <= above and time.monotonic() < deadline:
        time.sleep(0.2)
        stats = cache_stats(admin_url, headers)
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
    second_pass_steps: int = 0,
    link: LinkSpec | None = None,
    synth_shape: str = "256x256x1024",
    synth_steps: int = 40,
    png: Path | None = None,
    background_fill: str = "auto",
    direct: bool = True,
) -> dict[str, Any]:
    """Run every step in ``work``; returns the summary (also printed).

    Raises:
        DemoError, StackError, TrainerError, SeaweedError: a step failed.
    """
    link = link or LinkSpec(rtt_s=0.05, rate_bps=1e8)
    src = work / "src"
    src.mkdir(parents=True)
    synth = None
    if synth_steps > 0:  # written on the other core while F3 converts
        print(f"==> write a synthetic volume {synth_shape} (in the background)", flush=True)
        out = str(src / "synth.mdio")
        synth = subprocess.Popen(
            [sys.executable, "-m", "trainer", "synth", "--shape", synth_shape, "--out", out],
            stdout=subprocess.DEVNULL,
        )
    try:
        _run(
            "convert SEG-Y to MDIO",
            ["trainer", "prepare", "--segy", str(segy), "--out", str(src / "f3.mdio")],
        )
    finally:
        if synth is not None and synth.wait() != 0:
            raise DemoError(f"writing the synthetic volume failed (exit {synth.returncode})")
    version = _run(
        "publish to the hub as dataset f3",
        ["hub", "publish", "--data-dir", str(work / "hub"), "f3", str(src), "--tag", "latest"],
        capture=True,
    ).strip()
    fill = ("--background-fill", background_fill)
    runs: dict[str, dict[str, Any]] = {}
    with LocalStack() as stack:
        hub = stack.start_hub(work / "hub")
        with WanProxy(parse_hostport(hub), link) as wan, LinkSampler(wan) as sampler:
            print(f"==> hub behind an emulated WAN ({link.describe()})", flush=True)
            print("==> start the spoke (empty cache, nothing prewarmed)", flush=True)
            admin = stack.start_spoke(
                wan.address, work / "cache", work / "mnt", cache_size, extra=fill
            )
            auth = admin_headers(work / "cache")  # the token the spoke generated
            data = work / "mnt" / "f3" / "latest" / "f3.mdio"
            print(
                f"    hub {wan.address} (via the link), admin {admin}, reading {data}", flush=True
            )
            started = time.monotonic()
            _fit(data, work / "train", steps, batch_size, workers)
            train_s = time.monotonic() - started
            stats = wait_for_hits(admin, above=-1, timeout=1.0, headers=auth)
            second: dict[str, Any] = {}
            if second_pass_steps > 0:
                dropped = drop_page_cache()
                _fit(data, work / "train2", second_pass_steps, batch_size, workers)
                after = (
                    wait_for_hits(admin, above=stats["hits"], headers=auth)
                    if dropped
                    else cache_stats(admin, auth)
                )
                second = {
                    "steps": second_pass_steps,
                    "page_cache_dropped": dropped,
                    "new_hub_bytes": after["hub_fetch_bytes"] - stats["hub_fetch_bytes"],
                    "cache_hits": after["hits"] - stats["hits"],
                    "cache_misses": after["misses"] - stats["misses"],
                }
            if synth_steps > 0:
                stack.stop_spoke()
                shutil.rmtree(work / "cache")
                print("==> fresh spoke, empty cache: two epochs of the synthetic volume")
                synth_admin = stack.start_spoke(
                    wan.address, work / "cache", work / "mnt", cache_size, extra=fill
                )
                auth = admin_headers(work / "cache")  # the new spoke made a new token
                volume = work / "mnt" / "f3" / "latest" / "synth.mdio"
                drop_page_cache()
                before = cache_stats(synth_admin, auth)
                runs["strata"] = run = two_epochs(
                    volume, work / "synth-strata", sampler, synth_steps, batch_size, workers
                )
                after = wait_for_hits(synth_admin, above=before["hits"], headers=auth)
                run["cache_misses"] = after["misses"] - before["misses"]
                run["cache_hits"] = after["hits"] - before["hits"]
                run["hub_bytes"] = after["hub_fetch_bytes"] - before["hub_fetch_bytes"]
    why = direct_missing() if synth_steps > 0 and direct else "not asked for"
    if not why:  # the spoke is stopped: nothing of Strata's competes for the cores
        with bucket(src / "synth.mdio", work, link) as (url, env, direct_sampler):
            print(f"==> two epochs straight from the bucket: {url} (s3fs, through the link)")
            runs["direct s3fs"] = two_epochs(
                url, work / "synth-direct", direct_sampler, synth_steps, batch_size, workers, env
            )
    elif synth_steps > 0:
        print(f"==> direct streaming left out: {why}")
    train = json.loads((work / "train" / "summary.json").read_text())
    summary = {
        "dataset": f"f3@latest ({version})",
        "link": link.describe(),
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
        "two_epochs": {
            k: {x: y for x, y in v.items() if not x.endswith("bins")} for k, v in runs.items()
        },
    }
    _print(summary, second, runs)
    if runs and png is not None:
        timeline_png(runs, link, png)
        summary["timeline_png"] = str(png)
        print(f"  timeline           {png}")
    return summary


def _print(
    summary: dict[str, Any], second: dict[str, Any], runs: dict[str, dict[str, Any]]
) -> None:
    print(f"\n== Strata demo summary (first pass: cold cache, {summary['link']}) ==")
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
    if runs:
        _print_runs(runs)


def _print_runs(runs: dict[str, dict[str, Any]]) -> None:
    names = list(runs)
    print("\n  synthetic volume, two epochs " + "".join(f"{n:>14s}" for n in names))
    lines: list[tuple[str, Any]] = [
        ("start-up s", lambda r: f"{r['startup_s']:.1f}"),
        ("wall s", lambda r: f"{r['wall_s']:.1f}"),
        ("link MB, all", lambda r: f"{r['link_bytes'] / 1e6:,.0f}"),
    ]
    for e in range(len(runs[names[0]]["epochs"])):
        lines += [
            (f"epoch {e} s", lambda r, e=e: f"{r['epochs'][e]['wall_s']:.1f}"),
            (f"epoch {e} samples/s", lambda r, e=e: f"{r['epochs'][e]['samples_per_s']:.1f}"),
            (f"epoch {e} link MB", lambda r, e=e: f"{r['epochs'][e]['link_bytes'] / 1e6:,.0f}"),
        ]
    lines += [
        ("cache misses", lambda r: f"{r['cache_misses']:,}" if "cache_misses" in r else "–"),
        ("cache hits", lambda r: f"{r['cache_hits']:,}" if "cache_hits" in r else "–"),
    ]
    for label, cell in lines:
        print(f"  {label:28s} " + "".join(f"{cell(runs[n]):>14s}" for n in names))
    if len(names) == 2:
        a, b = (runs[n]["epochs"] for n in names)
        ratios = ", ".join(
            f"epoch {x['epoch']} {x['wall_s'] / y['wall_s']:.2f}x"
            for x, y in zip(a, b, strict=True)
            if y["wall_s"]
        )
        print(f"  {names[0]} / {names[1]} time   {ratios}")


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="strata-demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--segy", type=Path, default=None, help="SEG-Y file (default: F3)")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cache-size", default="1GiB")
    parser.add_argument(
        "--second-pass-steps",
        type=int,
        default=0,
        help="steps of a warm second pass over F3 (0, the default, skips it: the warm "
        "synthetic run shows the warm cache)",
    )
    parser.add_argument(
        "--background-fill",
        choices=("auto", "off"),
        default="auto",
        help="the spoke's --background-fill (auto, its default: the rest of a snapshot "
        "being read is fetched in the background; off: the cold runs read lazily)",
    )
    parser.add_argument(
        "--work",
        type=Path,
        default=None,
        help="working directory (default: a new temporary one, removed after)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the summary here")
    parser.add_argument("--rtt-ms", type=float, default=50.0, help="the emulated WAN's RTT")
    parser.add_argument(
        "--rate",
        default="100Mbit",
        help="the emulated WAN's rate each way (100Mbit: the synthetic volume takes about "
        "20 s to cross, longer than the trainer takes to start)",
    )
    parser.add_argument(
        "--synth-shape", default="256x256x1024", help="synthetic volume IxXxT (4 bytes a sample)"
    )
    parser.add_argument(
        "--synth-steps",
        type=int,
        default=40,
        help="steps of each synthetic run, two epochs of half as many (0 skips them)",
    )
    parser.add_argument(
        "--direct",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also train straight from a SeaweedFS bucket behind the same link (s3fs)",
    )
    parser.add_argument(
        "--png", type=Path, default=Path("demo-timeline.png"), help="where the timeline goes"
    )
    ns = parser.parse_args(argv)
    try:
        link = LinkSpec(rtt_s=ns.rtt_ms / 1000, rate_bps=parse_rate(ns.rate))
    except ValueError as err:
        print(f"strata-demo: error: {err}", file=sys.stderr)
        return 2
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
            work,
            segy,
            ns.steps,
            ns.batch_size,
            ns.workers,
            ns.cache_size,
            ns.second_pass_steps,
            link=link,
            synth_shape=ns.synth_shape,
            synth_steps=ns.synth_steps,
            png=ns.png,
            background_fill=ns.background_fill,
            direct=ns.direct,
        )
        if ns.json:
            ns.json.write_text(json.dumps(summary, indent=2) + "\n")
        return 0
    except (DemoError, StackError, TrainerError, SeaweedError, httpx.HTTPError) as err:
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
