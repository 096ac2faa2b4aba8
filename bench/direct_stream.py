"""Direct streaming from the object store beside local disk, at the loader-only load.

    python -m bench.direct_stream [--quick] [--shape 256x256x512] [--data VOLUME.mdio]
        [--epochs 3] [--workers 2] [--preset tiny] [--epoch-size 1024] [--chunk-aligned]
        [--compute-ms 0] [--rtt-ms 50] [--rate 1Gbit] [--rows local,memory,direct,strata]
        [--json FILE] [--plot PNG]

What a team that streams MDIO/Zarr straight from its bucket gets (issue 41, item 1): one
synthetic MDIO volume (``strata-train synth``, or ``--data``) is uploaded to a real
S3-compatible server (SeaweedFS, :mod:`bench.seaweed`) and read by the trainer's
loader-only mode (``strata-train load``, :mod:`trainer.loadonly`: fit's dataset, sampler,
workers and collation, no model) for several epochs in one process, in three rows:

* ``local``: the volume on local disk (the page cache is not dropped: a warm local read);
* ``memory``: the same loader fed from memory, its own ceiling (no store at all);
* ``direct s3fs``: ``s3://bucket/syn.mdio`` through fsspec/s3fs — MDIO's own cloud path —
  with the server behind :mod:`bench.wan` (default 50 ms RTT, 1 Gbit/s), endpoint and
  credentials in the environment as a user sets them;
* ``strata``: the same volume published to a local hub behind the same kind of link and
  read through a spoke's mount with its defaults and an empty cache
  (``MOUNT/syn/<version>/syn.mdio``): epoch 0 is cold, the later ones warm. Needs
  FUSE; left out (and said so) where it cannot mount.

Every epoch of the direct row pays the link again. Per row and epoch: wall seconds,
samples/s, payload MB/s (patch bytes the loader delivers), MB/s read from the store
(stored chunk bytes: each patch fetches every whole chunk it touches) and the data-wait
share; for the direct row, the bytes that came down the link in each epoch (sampled from
the link's counters and lined up with the epoch's start and end); the same for the
Strata row's link to its hub. The page cache is dropped before each row where this
process may (root). Every row must read the local row's patches, and s3fs exactly the
local read's stored bytes, epoch by epoch: the run fails otherwise.
``--plot`` draws every row on one time axis: each epoch a segment at its samples/s from
its start to its end, so Strata's cold epoch at the link's pace and its later epochs at
local disk's sit beside the direct path's flat, long line. ``--quick`` is a smoke run: a
tiny volume, two epochs of a few batches, one worker.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.measure import LinkSampler
from bench.seaweed import KEY, SECRET, SeaweedError, seaweedfs
from bench.wan import LinkSpec, WanProxy, format_rate, parse_hostport, parse_rate
from deploy.local import LocalStack, StackError, drop_page_cache, publish

QUICK = {
    "shape": "32x32x128", "chunks": "16x16x64", "epoch_size": 24, "epochs": 2, "workers": 1,
    "batch_size": 4,
}  # fmt: skip
"""The smoke run's sizes."""

BUCKET = "direct"

DATASET = "syn"
"""The Strata row's dataset name (its mount path is ``MOUNT/syn/<version>/<volume>``)."""

ROWS = {"local": "local", "memory": "memory", "direct": "direct s3fs", "strata": "strata"}
"""``--rows`` names and the labels they print as, in the order they run."""


def _trainer(args: list[str], env: dict[str, str] | None = None) -> None:
    """Run ``python -m trainer ARGS``; its own one-line error becomes this run's."""
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"trainer {args[0]} exited {proc.returncode}: {proc.stderr.strip()}")


def _upload(volume: Path, endpoint_url: str) -> str:
    """Put the volume in the bucket (straight to the server, not over the link)."""
    import s3fs  # type: ignore[import-untyped]

    fs = s3fs.S3FileSystem(key=KEY, secret=SECRET, endpoint_url=endpoint_url)
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    fs.put(str(volume), f"{BUCKET}/{volume.name}", recursive=True)
    return f"s3://{BUCKET}/{volume.name}"


def _load(
    data: str, ns: argparse.Namespace, out: Path, source: str, env: dict[str, str] | None = None
) -> dict[str, Any]:
    args = ["load", "--data", data, "--source", source, "--epochs", str(ns.epochs),
            "--workers", str(ns.workers), "--preset", ns.preset, "--epoch-size",
            str(ns.epoch_size), "--seed", str(ns.seed), "--compute-ms", str(ns.compute_ms),
            "--json", str(out)]  # fmt: skip
    if ns.batch_size is not None:
        args += ["--batch-size", str(ns.batch_size)]
    if ns.chunk_aligned:
        args.append("--chunk-aligned")
    _trainer(args, env)
    summary: dict[str, Any] = json.loads(out.read_text())
    return summary


def _linked(wan: WanProxy, run: Callable[[], dict[str, Any]]) -> tuple[dict[str, Any], int]:
    """``run()``'s summary with each epoch's ``link_bytes`` (what came down ``wan`` between
    its start and end, sampled every 50 ms), and the bytes of the whole run."""
    with LinkSampler(wan, 0.05) as link:
        t0 = link.mark()
        summary = run()
        t1 = link.mark()
        offset = time.time() - time.monotonic()  # epochs are stamped in Unix seconds
        for ep in summary["epochs"]:
            ep["link_bytes"] = link.down_bytes(ep["started_at"] - offset, ep["ended_at"] - offset)
    return summary, link.down_bytes(t0, t1)


def _direct(
    volume: Path, ns: argparse.Namespace, work: Path, spec: LinkSpec
) -> tuple[dict[str, Any], int]:
    with seaweedfs(work / "seaweedfs") as server:
        url = _upload(volume, server.url)
        with WanProxy((server.host, server.port), spec) as wan:
            env = server.env(f"http://{wan.address}")
            return _linked(wan, lambda: _load(url, ns, work / "direct.json", "store", env))


def _strata(
    volume: Path, ns: argparse.Namespace, work: Path, spec: LinkSpec
) -> tuple[dict[str, Any], int]:
    """A spoke with defaults and an empty cache, its hub behind the link."""
    tree = volume.parent
    if tree != work / "published":  # publish the volume alone, not what lies beside it
        tree = work / "published"
        shutil.copytree(volume, tree / volume.name)
    version = publish(work / "hub", DATASET, tree)
    size = sum(f.stat().st_size for f in volume.rglob("*") if f.is_file())
    with LocalStack() as stack:
        hub = stack.start_hub(work / "hub")
        with WanProxy(parse_hostport(hub), spec) as wan:
            stack.start_spoke(
                wan.address, work / "cache", work / "mnt", f"{2 * size // 2**20 + 256}MiB"
            )
            data = work / "mnt" / DATASET / version / volume.name
            return _linked(wan, lambda: _load(str(data), ns, work / "strata.json", "store"))


def _rows(summaries: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    local = summaries["local"]["epochs"]
    for name, summary in summaries.items():
        for ep, base in zip(summary["epochs"], local, strict=True):
            rows.append(
                {
                    "row": name,
                    "epoch": ep["epoch"],
                    "wall_s": ep["elapsed_s"],
                    "samples_per_s": ep["samples_per_s"],
                    "payload_mb_per_s": ep["payload_mb_per_s"],
                    "store_mb_per_s": ep["store_mb_per_s"],
                    "data_wait_fraction": ep["data_wait_fraction"],
                    "store_bytes": ep["store_bytes"],
                    "link_bytes": ep.get("link_bytes"),
                    "wall_vs_local": ep["elapsed_s"] / base["elapsed_s"],
                }
            )
    return rows


def _table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'row':<12} {'epoch':>5} {'wall s':>7} {'x local':>7} {'samples/s':>9} "
        f"{'MB/s patch':>10} {'MB/s store':>10} {'wait':>5} {'link MB':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        link = "" if r["link_bytes"] is None else f"{r['link_bytes'] / 1e6:.1f}"
        lines.append(
            f"{r['row']:<12} {r['epoch']:>5} {r['wall_s']:>7.2f} {r['wall_vs_local']:>7.2f} "
            f"{r['samples_per_s']:>9.0f} {r['payload_mb_per_s']:>10.1f} "
            f"{r['store_mb_per_s']:>10.1f} {100 * r['data_wait_fraction']:>4.0f}% {link:>8}"
        )
    return "\n".join(lines)


def _check(summaries: dict[str, dict[str, Any]]) -> None:
    """Every row read the local row's patches; s3fs its stored bytes too."""
    local = summaries["local"]["epochs"]
    for name, summary in summaries.items():
        for ep, want in zip(summary["epochs"], local, strict=True):
            if ep["reads_digest"] != want["reads_digest"]:
                raise RuntimeError(f"{name}, epoch {ep['epoch']}: other patches than local")
            if name == ROWS["direct"] and ep["store_bytes"] != want["store_bytes"]:
                raise RuntimeError(f"epoch {ep['epoch']}: s3fs read other bytes than local disk")


def run(ns: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Every row, in order; returns the report (``rows``, ``summaries``, ``link``...)."""
    if ns.data is not None:
        volume = Path(ns.data)
    else:
        volume = work / "published" / "syn.mdio"
        volume.parent.mkdir()
        _trainer(["synth", "--shape", ns.shape, "--chunks", ns.chunks, "--out", str(volume),
                  "--workers", "2"])  # fmt: skip
    spec = LinkSpec(rtt_s=ns.rtt_ms / 1000.0, rate_bps=ns.rate)
    summaries: dict[str, dict[str, Any]] = {}
    link_bytes: dict[str, int] = {}
    dropped = False
    for name in ("local", *(r for r in ROWS if r != "local" and r in ns.rows)):
        label = ROWS[name]
        dropped = drop_page_cache()
        if name == "local":
            summaries[label] = _load(str(volume), ns, work / "local.json", "store")
        elif name == "memory":
            summaries[label] = _load(str(volume), ns, work / "memory.json", "memory")
        elif name == "direct":
            summaries[label], link_bytes[label] = _direct(volume, ns, work, spec)
        else:
            summaries[label], link_bytes[label] = _strata(volume, ns, work, spec)
    _check(summaries)
    return {
        "volume": str(volume),
        "volume_bytes": sum(f.stat().st_size for f in volume.rglob("*") if f.is_file()),
        "page_cache_dropped": dropped,
        "link": {"rtt_ms": ns.rtt_ms, "rate_bps": ns.rate, "down_bytes": link_bytes},
        "loader": {
            k: summaries["local"][k]
            for k in ("preset", "patch", "batch_size", "workers", "compute_ms", "epoch_size")
        },
        "identical_bytes": ROWS["direct"] in summaries,
        "rows": _rows(summaries),
        "summaries": summaries,
    }


def fuse_missing() -> str | None:
    """Why a Strata mount cannot run here, or None when it can."""
    if not Path("/dev/fuse").exists():
        return "/dev/fuse is missing"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (Debian package fuse3)"
    return None


def plot(report: dict[str, Any], path: Path) -> None:
    """Samples/s of every row's epochs on one time axis (seconds since the row's first
    epoch started; epoch 0 starts with the workers), written as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4), constrained_layout=True)
    for i, (name, summary) in enumerate(report["summaries"].items()):
        epochs = summary["epochs"]
        t0 = epochs[0]["started_at"]
        color = f"C{i}"
        for ep in epochs:
            start, end = ep["started_at"] - t0, ep["ended_at"] - t0
            ax.hlines(ep["samples_per_s"], start, end, color=color, linewidth=2.5)
            ax.axvline(end, color=color, linewidth=0.5, linestyle=":")
        ax.plot([], [], color=color, linewidth=2.5, label=name)
    link = report["link"]
    ax.set_yscale("log")
    ax.set_xlabel("seconds since the row's first epoch started (dotted: an epoch ends)")
    ax.set_ylabel("samples/s in each epoch")
    ax.set_title(
        f"{len(report['rows']) // max(1, len(report['summaries']))} epochs of the loader-only "
        f"load, {report['loader']['preset']} patches; link {link['rtt_ms']:g} ms RTT, "
        f"{format_rate(link['rate_bps'])}"
    )
    ax.legend(loc="best", fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _rows_arg(text: str) -> list[str]:
    rows = [r.strip() for r in text.split(",") if r.strip()]
    unknown = sorted(set(rows) - set(ROWS))
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown rows {', '.join(unknown)} (of {', '.join(ROWS)})"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    """Entry point: prints the table; ``--json`` also writes the report."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.direct_stream",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run (tiny sizes)")
    parser.add_argument("--data", type=Path, default=None, help="an existing MDIO volume")
    parser.add_argument("--shape", default="256x256x512", help="synthetic volume IxXxT")
    parser.add_argument("--chunks", default="64x64x64", help="its chunk shape")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers, every row")
    parser.add_argument("--preset", default="tiny", help="patch shape and batch size")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--epoch-size", type=int, default=1024)
    parser.add_argument("--chunk-aligned", action="store_true")
    parser.add_argument("--compute-ms", type=float, default=0.0, help="emulated, per batch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rtt-ms", type=float, default=50.0)
    parser.add_argument("--rate", type=parse_rate, default=parse_rate("1Gbit"))
    parser.add_argument(
        "--rows", type=_rows_arg, default=list(ROWS), help="of local,memory,direct,strata"
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None, help="PNG: every row on one time axis")
    ns = parser.parse_args(argv)
    missing = fuse_missing()
    if "strata" in ns.rows and missing is not None:
        print(f"strata row left out: {missing}")
        ns.rows = [r for r in ns.rows if r != "strata"]
    if ns.quick:
        for name, value in QUICK.items():
            setattr(ns, name, value)
    with tempfile.TemporaryDirectory(prefix="strata-direct-") as tmp:
        try:
            report = run(ns, Path(tmp))
        except (RuntimeError, SeaweedError, StackError) as exc:
            sys.stderr.write(f"bench.direct_stream: error: {exc}\n")
            return 1
    link = report["link"]
    down = ", ".join(f"{name} {n / 1e6:.1f} MB" for name, n in link["down_bytes"].items())
    print(
        f"{report['volume_bytes'] / 1e6:.1f} MB volume, loader {report['loader']}, link "
        f"{link['rtt_ms']:g} ms RTT / {format_rate(link['rate_bps'])}; down the link: "
        f"{down or 'nothing'}; page cache dropped before each row: "
        f"{'yes' if report['page_cache_dropped'] else 'no (not root)'}"
    )
    print(_table(report["rows"]))
    print("every row read the local row's patches, epoch by epoch: yes")
    if report["identical_bytes"]:
        print("stored bytes read through s3fs identical to local disk, epoch by epoch: yes")
    if ns.json is not None:
        ns.json.write_text(json.dumps(report, indent=2) + "\n")
    if ns.plot is not None:
        plot(report, ns.plot)
        print(f"wrote {ns.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
