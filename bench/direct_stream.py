"""Direct streaming from the object store beside local disk, at the loader-only load.

    python -m bench.direct_stream [--quick] [--shape 256x256x512] [--data VOLUME.mdio]
        [--epochs 3] [--workers 2] [--preset tiny] [--epoch-size 1024] [--chunk-aligned]
        [--compute-ms 0] [--rtt-ms 50] [--rate 1Gbit]
        [--rows local,memory,copy,direct,obstore,strata]
        [--json FILE] [--plot PNG]

What a team that streams MDIO/Zarr straight from its bucket gets (issue 41, item 1): one
synthetic MDIO volume (``strata-train synth``, or ``--data``) is uploaded to a real
S3-compatible server (SeaweedFS, :mod:`bench.seaweed`) and read by the trainer's
loader-only mode (``strata-train load``, :mod:`trainer.loadonly`: fit's dataset, sampler,
workers and collation, no model) for several epochs in one process, in these rows:

* ``local``: the volume on local disk (the page cache is not dropped: a warm local read);
* ``memory``: the same loader fed from memory, its own ceiling (no store at all);
* ``copy-first``: the whole volume downloaded from the bucket over the link first
  (s3fs), then read from local disk; its epoch 0 wall and link bytes include the copy;
* ``direct s3fs``: ``s3://bucket/syn.mdio`` through fsspec/s3fs — MDIO's own cloud path —
  with the server behind :mod:`bench.wan` (default 50 ms RTT, 1 Gbit/s), endpoint and
  credentials in the environment as a user sets them;
* ``direct obstore``: the same URL through zarr's ``ObjectStore`` over obstore
  (``strata-train load --client obstore``, :mod:`trainer.objstore`); both direct rows run
  with ``ZARR_ASYNC_CONCURRENCY=64`` (:data:`ZARR_CONCURRENCY`);
* ``strata``: the same volume published to a local hub behind the same kind of link and
  read through a spoke's mount with its defaults and an empty cache
  (``MOUNT/syn/<version>/syn.mdio``): epoch 0 is cold, the later ones warm. Needs
  FUSE; left out (and said so) where it cannot mount.

Every epoch of the direct row pays the link again. Per row and epoch: wall seconds,
samples/s, payload MB/s (patch bytes the loader delivers), MB/s read from the store
(stored chunk bytes: each patch fetches every whole chunk it touches) and the data-wait
share; for the direct row, the bytes that came down the link in each epoch (sampled from
the link's counters and lined up with the epoch's start and end); the same for the
Strata row's link to its hub; per row, the CPU seconds per GiB of stored chunks read
(:func:`cpu_per_gib`: the loader's processes, plus the spoke's for Strata). The page
cache is dropped before each row where this process may (root). Every row must read the
local row's patches, and each direct row exactly the local read's stored bytes, epoch by
epoch: the run fails otherwise.
``--plot`` draws every row on one time axis (:mod:`bench.direct_stream_plot`): each epoch
a segment at its samples/s from its start to its end, so Strata's cold epoch at the link's
pace and its later epochs at local disk's sit beside the direct path's flat, long line.
``--quick`` is a smoke run: a tiny volume, two epochs of a few batches, one worker.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.direct_stream_plot import plot
from bench.measure import LinkSampler, tree_cpu_seconds
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

ROWS = {
    "local": "local", "memory": "memory", "copy": "copy-first", "direct": "direct s3fs",
    "obstore": "direct obstore", "strata": "strata",
}  # fmt: skip
"""``--rows`` names and the labels they print as, in the order they run."""

DIRECT = {"direct": "fsspec", "obstore": "obstore"}
"""The direct rows and the client each reads the bucket with (``strata-train load
--client``)."""

ZARR_CONCURRENCY = "64"
"""``ZARR_ASYNC_CONCURRENCY`` of the direct rows: zarr's own default from 3.2 on, which
its performance guide recommends for object stores (3.1.6, locked here, defaults to 10).
A patch touches at most 8 chunks, so each worker has at most 8 requests in flight."""


def _trainer(args: list[str], env: dict[str, str] | None = None) -> float:
    """Run ``python -m trainer ARGS``; returns the CPU seconds (user + system) it and its
    DataLoader workers used. Its own one-line error becomes this run's."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"trainer {args[0]} exited {proc.returncode}: {proc.stderr.strip()}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _upload(volume: Path, endpoint_url: str) -> str:
    """Put the volume in the bucket (straight to the server, not over the link)."""
    import s3fs  # type: ignore[import-untyped]

    fs = s3fs.S3FileSystem(key=KEY, secret=SECRET, endpoint_url=endpoint_url)
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    fs.put(str(volume), f"{BUCKET}/{volume.name}", recursive=True)
    return f"s3://{BUCKET}/{volume.name}"


def _load(
    data: str,
    ns: argparse.Namespace,
    out: Path,
    source: str,
    env: dict[str, str] | None = None,
    client: str = "fsspec",
) -> dict[str, Any]:
    """One ``strata-train load`` run: its summary, with ``loader_cpu_s`` added."""
    args = ["load", "--data", data, "--source", source, "--client", client, "--epochs",
            str(ns.epochs), "--workers", str(ns.workers), "--preset", ns.preset, "--epoch-size",
            str(ns.epoch_size), "--seed", str(ns.seed), "--compute-ms", str(ns.compute_ms),
            "--json", str(out)]  # fmt: skip
    if ns.batch_size is not None:
        args += ["--batch-size", str(ns.batch_size)]
    if ns.chunk_aligned:
        args.append("--chunk-aligned")
    cpu = _trainer(args, env)
    summary: dict[str, Any] = json.loads(out.read_text())
    summary["loader_cpu_s"] = cpu
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
    server: Any, url: str, ns: argparse.Namespace, work: Path, spec: LinkSpec, name: str
) -> tuple[dict[str, Any], int]:
    """The loader reading ``url`` straight from the bucket behind the link, through the
    row's client (:data:`DIRECT`)."""
    with WanProxy((server.host, server.port), spec) as wan:
        env = {**server.env(f"http://{wan.address}"), "ZARR_ASYNC_CONCURRENCY": ZARR_CONCURRENCY}
        out = work / f"{name}.json"
        return _linked(wan, lambda: _load(url, ns, out, "store", env, DIRECT[name]))


def _copy_first(
    server: Any, volume: Path, ns: argparse.Namespace, work: Path, spec: LinkSpec
) -> tuple[dict[str, Any], int]:
    """Download the whole volume from the bucket over the link (s3fs, its default
    concurrency), then run the loader on the copy; ``copy_s`` and ``copy_link_bytes``
    are added to the summary."""
    import s3fs

    dest = work / "copy" / volume.name
    dest.parent.mkdir()
    with WanProxy((server.host, server.port), spec) as wan, LinkSampler(wan, 0.05) as link:
        fs = s3fs.S3FileSystem(key=KEY, secret=SECRET, endpoint_url=f"http://{wan.address}")
        t0 = link.mark()
        started = time.perf_counter()
        fs.get(f"{BUCKET}/{volume.name}", str(dest), recursive=True)
        copy_s = time.perf_counter() - started
        copied = link.down_bytes(t0, link.mark())
    summary = _load(str(dest), ns, work / "copy.json", "store")
    summary["copy_s"], summary["copy_link_bytes"] = copy_s, copied
    return summary, copied


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
    cpu: dict[str, float] = {}
    with LocalStack() as stack:
        hub = stack.start_hub(work / "hub")
        with WanProxy(parse_hostport(hub), spec) as wan:
            stack.start_spoke(
                wan.address, work / "cache", work / "mnt", f"{2 * size // 2**20 + 256}MiB"
            )
            data = work / "mnt" / DATASET / version / volume.name
            pid = None if stack.spoke is None else stack.spoke.pid

            def load() -> dict[str, Any]:
                cpu["before"] = tree_cpu_seconds(pid)
                summary = _load(str(data), ns, work / "strata.json", "store")
                summary["fs_cpu_s"] = tree_cpu_seconds(pid) - cpu["before"]
                return summary

            return _linked(wan, load)


def _rows(summaries: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    local = summaries["local"]["epochs"]
    for name, summary in summaries.items():
        for ep, base in zip(summary["epochs"], local, strict=True):
            wall = ep["elapsed_s"] + (summary.get("copy_s", 0.0) if ep["epoch"] == 0 else 0.0)
            link = ep.get("link_bytes")
            if ep["epoch"] == 0 and "copy_link_bytes" in summary:
                link = summary["copy_link_bytes"]
            rows.append(
                {
                    "row": name,
                    "epoch": ep["epoch"],
                    "wall_s": wall,
                    "samples_per_s": ep["samples_per_s"],
                    "payload_mb_per_s": ep["payload_mb_per_s"],
                    "store_mb_per_s": ep["store_mb_per_s"],
                    "data_wait_fraction": ep["data_wait_fraction"],
                    "store_bytes": ep["store_bytes"],
                    "link_bytes": link,
                    "wall_vs_local": wall / base["elapsed_s"],
                }
            )
    return rows


def _table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'row':<15} {'epoch':>5} {'wall s':>7} {'x local':>7} {'samples/s':>9} "
        f"{'MB/s patch':>10} {'MB/s store':>10} {'wait':>5} {'link MB':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        link = "" if r["link_bytes"] is None else f"{r['link_bytes'] / 1e6:.1f}"
        lines.append(
            f"{r['row']:<15} {r['epoch']:>5} {r['wall_s']:>7.2f} {r['wall_vs_local']:>7.2f} "
            f"{r['samples_per_s']:>9.0f} {r['payload_mb_per_s']:>10.1f} "
            f"{r['store_mb_per_s']:>10.1f} {100 * r['data_wait_fraction']:>4.0f}% {link:>8}"
        )
    return "\n".join(lines)


def cpu_per_gib(summary: dict[str, Any]) -> float | None:
    """CPU seconds per GiB of stored chunk bytes the loader read over the whole run: the
    loader process and its workers, plus the file system's own (a spoke's daemon and
    mount) where it has one. None when nothing was read from a store (memory)."""
    stored = sum(ep["store_bytes"] for ep in summary["epochs"])
    if not stored:
        return None
    return (summary["loader_cpu_s"] + summary.get("fs_cpu_s", 0.0)) / (stored / 2**30)


def _check(summaries: dict[str, dict[str, Any]]) -> None:
    """Every row read the local row's patches; the direct rows its stored bytes too."""
    local = summaries["local"]["epochs"]
    for name, summary in summaries.items():
        for ep, want in zip(summary["epochs"], local, strict=True):
            if ep["reads_digest"] != want["reads_digest"]:
                raise RuntimeError(f"{name}, epoch {ep['epoch']}: other patches than local")
            if name.startswith("direct") and ep["store_bytes"] != want["store_bytes"]:
                raise RuntimeError(f"{name}, epoch {ep['epoch']}: other bytes than local disk")


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
    with contextlib.ExitStack() as stack:
        bucket: tuple[Any, str] | None = None
        for name in ("local", *(r for r in ROWS if r != "local" and r in ns.rows)):
            label = ROWS[name]
            if name in ("copy", *DIRECT) and bucket is None:  # one server for these rows
                server = stack.enter_context(seaweedfs(work / "seaweedfs"))
                bucket = server, _upload(volume, server.url)
            dropped = drop_page_cache()
            if name in ("local", "memory"):
                source = "store" if name == "local" else "memory"
                summaries[label] = _load(str(volume), ns, work / f"{name}.json", source)
            elif name == "copy" and bucket is not None:
                summaries[label], link_bytes[label] = _copy_first(bucket[0], volume, ns, work, spec)
            elif name in DIRECT and bucket is not None:
                summaries[label], link_bytes[label] = _direct(*bucket, ns, work, spec, name)
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
        "identical_bytes": [n for n in summaries if n.startswith("direct")],
        "zarr_concurrency": ZARR_CONCURRENCY,
        "cpu_s_per_gib": {n: cpu_per_gib(s) for n, s in summaries.items()},
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


def _rows_arg(text: str) -> list[str]:
    rows = [r.strip() for r in text.split(",") if r.strip()]
    unknown = sorted(set(rows) - set(ROWS))
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown rows {', '.join(unknown)} (of {', '.join(ROWS)})"
        )
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring); :func:`run` takes the result.

    Raises:
        SystemExit: On a bad argument (argparse's own message).
    """
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
    parser.add_argument("--rows", type=_rows_arg, default=list(ROWS), help="of " + ",".join(ROWS))
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None, help="PNG: every row on one time axis")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Entry point: prints the table; ``--json`` also writes the report."""
    ns = parse_args(argv)
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
    cpu = ", ".join(f"{n} {v:.1f}" for n, v in report["cpu_s_per_gib"].items() if v is not None)
    print(f"CPU-s per GiB of stored chunks read (loader + file system): {cpu}")
    for name in report["identical_bytes"]:
        print(f"stored bytes read by {name} identical to local disk, epoch by epoch: yes")
    if ns.json is not None:
        ns.json.write_text(json.dumps(report, indent=2) + "\n")
    if ns.plot is not None:
        plot(report, ns.plot)
        print(f"wrote {ns.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
