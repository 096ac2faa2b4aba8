"""``strata-demo``: the whole system on one machine, behind an emulated WAN.

1. convert ``f3.sgy`` (the real F3 seismic volume, SEG-Y) to MDIO with
   ``strata-train prepare`` while a synthetic volume large enough for a cold start to
   show is written beside it (``strata-train synth``, ``--synth-shape``: 256 MiB of 1 MiB
   chunk files by default; F3 itself is 120 KiB, one round trip of link time);
2. publish both to a local hub as dataset ``f3`` (tag ``latest``), and put the hub behind
   the WAN emulator (:mod:`bench.wan`: 50 ms RTT, 1 Gbit/s unless told otherwise);
3. start a spoke (daemon + FUSE mount) with an empty cache, prewarming nothing: it
   reaches the hub only through the link (``--background-fill`` passes the spoke's
   option on; ``auto`` by default, as in the spoke: once a snapshot is read, the rest of
   it is fetched at the lowest priority);
4. train the tiny 3D ViT-MAE reading ``MOUNT/f3/latest/f3.mdio`` (and, with
   ``--second-pass-steps``, a second pass on the warm cache);
5. train on the synthetic volume cold (a fresh, empty cache: every chunk a reader
   touches first is a miss over the link) and then warm (page cache dropped when root:
   every read a cache hit, no hub bytes), and print the two side by side (samples/s,
   data wait, first batch, wall time, bytes over the link, cache misses);
6. write ``demo-timeline.png``: samples/s and link MB/s per 1 s, cold and warm.

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

from bench.measure import LinkSampler, TrainerError, TrainerRun, run_trainer
from bench.wan import LinkSpec, WanProxy, parse_hostport, parse_rate
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
    synth_steps: int = 60,
    png: Path | None = None,
    background_fill: str = "auto",
) -> dict[str, Any]:
    """Run every step in ``work``; returns the summary (also printed).

    Raises:
        DemoError, StackError, TrainerError: a step failed.
    """
    link = link or LinkSpec(rtt_s=0.05, rate_bps=1e9)
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
    side: dict[str, Any] = {}
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
                print("==> fresh spoke, empty cache: the synthetic volume cold, then warm")
                synth_admin = stack.start_spoke(
                    wan.address, work / "cache", work / "mnt", cache_size, extra=fill
                )
                auth = admin_headers(work / "cache")  # the new spoke made a new token
                volume = work / "mnt" / "f3" / "latest" / "synth.mdio"
                for name in ("cold", "warm"):
                    if name == "warm":
                        drop_page_cache()
                    print(f"==> train {synth_steps} steps on the synthetic volume, {name}")
                    before = cache_stats(synth_admin, auth)
                    t0 = sampler.mark()
                    run = run_trainer(
                        volume, work / f"synth-{name}", synth_steps, workers, batch_size
                    )
                    t1 = sampler.mark()
                    after = wait_for_hits(synth_admin, above=before["hits"], headers=auth)
                    side[name] = _side(run, batch_size, sampler, t0, t1)
                    side[name]["cache_misses"] = after["misses"] - before["misses"]
                    side[name]["hub_bytes"] = after["hub_fetch_bytes"] - before["hub_fetch_bytes"]
                    side[name]["cache_hits"] = after["hits"] - before["hits"]
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
        "cold_vs_warm": {
            k: {x: y for x, y in v.items() if not x.endswith("bins")} for k, v in side.items()
        },
    }
    _print(summary, second, side)
    if side and png is not None:
        timeline_png(side, link, png)
        summary["timeline_png"] = str(png)
        print(f"  timeline           {png}")
    return summary


def _side(
    run: TrainerRun, batch_size: int, sampler: LinkSampler, t0: float, t1: float
) -> dict[str, Any]:
    """One synthetic run's figures; ``train_s`` is steps 2..N (what ``samples_per_s`` and
    ``data_wait_fraction`` cover), without the trainer's start-up (torch's import, the
    model, the DataLoader's workers), which costs the same cold and warm."""
    return {
        "samples_per_s": round(run.samples_per_s, 1),
        "train_s": (
            round((run.steps - 1) * batch_size / run.samples_per_s, 1)
            if run.samples_per_s > 0
            else 0.0
        ),
        "data_wait_fraction": round(run.data_wait_fraction, 4),
        "first_batch_s": round(run.time_to_first_batch_s, 2),
        "wall_s": round(run.wall_s, 1),
        "link_bytes": sampler.down_bytes(t0, t1),
        "samples_bins": run.bins_samples_s,
        "link_bins": sampler.bins_mb_s(t0, t1),
    }


def _print(summary: dict[str, Any], second: dict[str, Any], side: dict[str, Any]) -> None:
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
    if side:
        print("\n  synthetic volume   cold        warm")
        for key, label, fmt in (
            ("samples_per_s", "samples/s", "{:.1f}"),
            ("data_wait_fraction", "data wait", "{:.1%}"),
            ("first_batch_s", "first batch s", "{:.2f}"),
            ("train_s", "steps 2..N s", "{:.1f}"),
            ("wall_s", "wall s", "{:.1f}"),
            ("link_bytes", "link MB", "{:.0f}"),
            ("hub_bytes", "hub block MB", "{:.0f}"),
            ("cache_misses", "cache misses", "{:,.0f}"),
            ("cache_hits", "cache hits", "{:,.0f}"),
        ):
            values = [
                side[n][key] / (1e6 if key.endswith("bytes") else 1) for n in ("cold", "warm")
            ]
            print(f"  {label:18s} " + "".join(f"{fmt.format(v):12s}" for v in values))
        cold, warm = side["cold"], side["warm"]
        if warm["train_s"] > 0 and warm["samples_per_s"] > 0:
            print(
                f"  cold / warm        steps 2..N {cold['train_s'] / warm['train_s']:.2f}x "
                f"the time, samples/s {cold['samples_per_s'] / warm['samples_per_s']:.2f}x"
            )


def timeline_png(side: dict[str, Any], link: LinkSpec, path: Path) -> None:
    """Samples/s and link MB/s per 1 s of the cold and the warm run, one panel each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(9, 6), sharex=True, constrained_layout=True)
    for ax, name in zip(axes, ("cold", "warm"), strict=True):
        run = side[name]
        samples = run["samples_bins"]
        offset = max(0.0, run["wall_s"] - len(samples))  # the trainer's start-up
        ax.step([offset + i for i in range(len(samples))], samples, where="post", color="tab:blue")
        ax.set_ylabel("samples/s", color="tab:blue")
        ax.set_ylim(bottom=0)
        twin = ax.twinx()
        twin.step(range(len(run["link_bins"])), run["link_bins"], where="post", color="tab:red")
        twin.set_ylabel("link MB/s", color="tab:red")
        twin.set_ylim(0, max(1.0, link.rate_bps / 8e6, *run["link_bins"]))  # the link's rate
        ax.set_title(f"{name}: {run['samples_per_s']:.0f} samples/s, {run['wall_s']:.1f} s")
    axes[-1].set_xlabel("seconds since the trainer command started")
    fig.suptitle(f"Strata demo: the synthetic volume cold, then warm ({link.describe()})")
    fig.savefig(path, dpi=100)
    plt.close(fig)


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
    parser.add_argument("--rate", default="1Gbit", help="the emulated WAN's rate each way")
    parser.add_argument(
        "--synth-shape", default="256x256x1024", help="synthetic volume IxXxT (4 bytes a sample)"
    )
    parser.add_argument(
        "--synth-steps", type=int, default=60, help="steps of each synthetic run (0 skips them)"
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
        )
        if ns.json:
            ns.json.write_text(json.dumps(summary, indent=2) + "\n")
        return 0
    except (DemoError, StackError, TrainerError, httpx.HTTPError) as err:
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
