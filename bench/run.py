"""Strata beside local disk, copy-first, rclone, httpdirfs and direct streaming, over one WAN.

    python -m bench.run [--quick] [--size 1GiB] [--rtt-ms 50] [--rate 1Gbit] [--steps 100]
                        [--only strata,rclone,...] [--markdown BENCHMARKS.md]

One run, one data set (a synthetic MDIO volume with 1 MiB chunks plus the real F3 volume,
see :mod:`bench.data`), one link (:mod:`bench.wan`, default 50 ms RTT and 1 Gbit/s):

1. **local**: the files already on this node's disk (the co-located baseline);
2. **copy-first**: download the whole tree over the link (HTTP, 8 connections), then read
   it locally; its first byte and first batch wait for the whole copy;
3. **strata cold**: a spoke with an empty cache, its hub behind the link;
4. **strata warm**: the second pass, first as it comes (page cache kept), then with the
   kernel page cache dropped (``echo 3 > /proc/sys/vm/drop_caches``) before each measure;
5. **rclone**: ``rclone mount --vfs-cache-mode full`` of the same files served over HTTP
   through the same kind of link, cold and then warm (page cache dropped);
6. **httpdirfs**: ``httpdirfs --cache``, same HTTP source, cold and warm.
7. **epochs**: the loader-only load (``strata-train load``) for three epochs on its own
   volume, local, copy-first, direct s3fs, direct obstore (SeaweedFS behind the same kind
   of link) and Strata: one table and one time axis (:mod:`bench.scenarios.epochs`; left
   out with ``--quick``).

Per scenario: time to first byte; fio's sequential 1 MiB, random 4 KiB and random 1 MiB
reads (4 workers each); the trainer's time to first batch, samples/s and data-wait
fraction over ``--steps`` steps. Cold scenarios also run the trainer on an empty cache
and a sequential cold pass whose throughput is logged in 1 s bins, with the time to
steady state, the link utilisation and the bytes that crossed the link.

Writes ``bench/results/<timestamp>.json`` and two PNG plots next to it, prints the
table, and (full runs, or with ``--markdown``) updates BENCHMARKS.md. Scenarios whose
tools are missing (fio, rclone, httpdirfs, /dev/fuse) are reported as skipped. Every
mount is detached and every process stopped on exit, error or Ctrl-C; all traffic stays
on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from bench import fio, report
from bench.copy_first import CopyError
from bench.data import DataError, default_cache_dir, ensure_dataset, parse_size
from bench.env import machine_info, versions
from bench.measure import LinkSampler, TrainerError
from bench.mounts import MountError
from bench.scenarios import BY_GROUP, LABELS, SCENARIOS, BenchError, Context, Row, Settings
from bench.scenarios.base import DATASET
from bench.targets import targets
from bench.wan import LinkSpec, WanProxy, parse_hostport, parse_rate
from deploy.local import LocalStack, StackError, drop_page_cache, publish, stop_process
from spoke.disk.mountinfo import is_mounted, lazy_unmount

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "bench" / "results"

GROUPS = tuple(s.group for s in SCENARIOS)
"""Scenario groups, in the order they run (``--only`` picks among them)."""

ROWS = {s.group: s.rows for s in SCENARIOS}
"""Each group's rows, in order."""

QUICK_TRAINER_ROWS = frozenset(
    {"local", "strata-cold", "strata-warm-dropped", "strata-cold-hints", "strata-cold-lazy"}
)
"""With ``--quick`` the trainer runs only here (each run costs seconds of start-up, and
httpdirfs's cold one tens of seconds of listing)."""

__all__ = ["GROUPS", "LABELS", "ROWS", "Row", "Settings", "main", "run_suite", "write_outputs"]


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _start_http_source(root: Path, work: Path) -> tuple[subprocess.Popen[bytes], int]:
    port_file = work / "http.port"
    port_file.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.http_source", "--root", str(root), "--port-file", port_file],
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise BenchError("the HTTP source server did not start")
        time.sleep(0.05)
    return proc, int(port_file.read_text())


def run_suite(settings: Settings, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Run every selected scenario; returns the result dictionary (not yet written).

    Raises:
        BenchError, DataError, StackError: Setting up the data, hub or links failed.
    """
    started = datetime.datetime.now(datetime.UTC)
    t_start = time.monotonic()
    machine = machine_info()
    data = ensure_dataset(settings.cache_dir, settings.size_bytes, echo=echo)
    can_drop = settings.drop_caches and drop_page_cache(3)
    ctx = Context(settings=settings, data=data, can_drop=can_drop, echo=echo)
    rows: list[Row] = []
    group_s: dict[str, float] = {}
    selected = [BY_GROUP[g] for g in settings.groups]
    with contextlib.ExitStack() as stack:
        needs_hub = any(s.needs_hub and not s.missing() for s in selected)
        needs_http = any(s.needs_http for s in selected)
        if needs_hub:
            echo(f"==> publishing {data.files:,} files ({data.bytes / 2**20:,.0f} MiB) to a hub")
            ctx.version = publish(settings.work / "hub", DATASET, data.root, "--tag", "latest")
            hub = stack.enter_context(LocalStack()).start_hub(settings.work / "hub")
            ctx.hub_link = stack.enter_context(WanProxy(parse_hostport(hub), settings.link))
            ctx.hub_sampler = stack.enter_context(LinkSampler(ctx.hub_link))
        if needs_http:
            proc, port = _start_http_source(data.root, settings.work)
            stack.callback(stop_process, proc, 10.0)
            ctx.http_link = stack.enter_context(WanProxy(("127.0.0.1", port), settings.link))
            ctx.http_sampler = stack.enter_context(LinkSampler(ctx.http_link))
        for scenario in selected:
            group = scenario.group
            why = scenario.missing()
            if why:
                echo(f"==> {group}: skipped ({why})")
                rows += [Row(n, status="skipped", reason=why) for n in scenario.rows]
                continue
            echo(f"==> {group}")
            t_group = time.monotonic()
            try:
                rows += scenario.run(ctx)
                ctx.rows.update((r.name, r) for r in rows)
            except (
                OSError,
                BenchError,
                CopyError,
                MountError,
                StackError,
                TrainerError,
                fio.FioError,
            ) as err:
                echo(f"    failed: {err}")
                traceback.print_exc(file=sys.stderr)
                done = {r.name for r in rows}
                rows += [
                    Row(n, status="failed", reason=str(err).splitlines()[0][:200])
                    for n in scenario.rows
                    if n not in done
                ]
            group_s[group] = time.monotonic() - t_group
            echo(f"    ({group_s[group]:.0f} s)")
    by_name = {r.name: r for r in rows}
    page_note = (
        "dropped (`echo 3 > /proc/sys/vm/drop_caches`) before each measure of the rows "
        "marked so, and before each cold phase"
        if can_drop
        else "NOT dropped ("
        + ("not root" if settings.drop_caches else "--no-drop-caches")
        + "): warm figures include page-cache reads"
    )
    return {
        "started": started.strftime("%Y-%m-%d %H:%M:%S UTC"),
        "elapsed_s": time.monotonic() - t_start,
        "group_elapsed_s": group_s,
        "command": "",
        "quick": settings.quick,
        "machine": machine,
        "versions": versions(),
        "settings": {
            "link": settings.link.describe(),
            "link_rtt_s": settings.link.rtt_s,
            "link_rate_bps": settings.link.rate_bps,
            "link_jitter_s": settings.link.jitter_s,
            "size_bytes": settings.size_bytes,
            "steps": settings.steps,
            "trainer_repeat": settings.trainer_repeat,
            "workers": settings.workers,
            "batch_size": settings.batch_size,
            "fio_workers": fio.WORKERS,
            "fio_runtime_s": settings.fio_runtime_s,
            "cold_cap_s": settings.cold_cap_s,
            "groups": list(settings.groups),
            "page_cache_dropped": can_drop,
            "page_cache_note": page_note,
        },
        "dataset": {
            "shape": list(data.shape),
            "files": data.files,
            "bytes": data.bytes,
            "f3": data.f3 is not None,
            "description": (
                f"synthetic MDIO volume {'×'.join(map(str, data.shape))} float32 "
                "(64³ chunks, uncompressed: 1 MiB files)"
                + (" + the real F3 volume (MDIO)" if data.f3 is not None else "")
            ),
        },
        "scenarios": [r.to_dict() for r in rows],
        "targets": targets(by_name, settings.link),
    }


def write_outputs(
    result: dict[str, Any], results_dir: Path, markdown: Path | None, echo: Callable[[str], None]
) -> dict[str, Path]:
    """Write the JSON and the plots, print the tables, update the markdown file."""
    results_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    json_path = results_dir / f"{stamp}.json"
    plots = report.plot(result, results_dir / stamp)
    result["plots"] = [str(p) for p in plots]
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    echo("")
    echo(report.markdown_table(result))
    echo("")
    echo(report.targets_table(result))
    echo("")
    echo(f"wrote {json_path}")
    for p in plots:
        echo(f"wrote {p}")
    if markdown is not None:
        report.update_document(result, plots, markdown)
        echo(f"updated {markdown}")
    return {"json": json_path, "cold_png": plots[0], "scenarios_png": plots[1]}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(
        prog="python -m bench.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="a small version (smoke test, ~2 min)")
    p.add_argument("--size", default=None, help="synthetic volume size (default 1GiB; quick 16MiB)")
    p.add_argument("--rtt-ms", type=float, default=50.0, help="link round-trip time")
    p.add_argument("--rate", default="1Gbit", help="link capacity each way, e.g. 1Gbit, inf")
    p.add_argument("--jitter-ms", type=float, default=0.0, help="extra one-way delay, 0..J ms")
    p.add_argument("--steps", type=int, default=None, help="trainer steps (default 100; quick 3)")
    p.add_argument("--workers", type=int, default=None, help="DataLoader workers (default 2)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument(
        "--trainer-repeat",
        type=int,
        default=None,
        help="alternating trainer runs, local vs warm Strata (default 3; quick 1)",
    )
    p.add_argument("--fio-runtime", type=float, default=None, help="random fio jobs, s")
    p.add_argument("--cold-cap", type=float, default=600.0, help="longest cold pass, s")
    p.add_argument("--only", default=",".join(GROUPS), help="groups: " + ",".join(GROUPS))
    p.add_argument("--data-cache", type=Path, default=None, help="generated data sets")
    p.add_argument("--results", type=Path, default=RESULTS_DIR, help="JSON and PNG output")
    p.add_argument(
        "--markdown",
        type=Path,
        default=None,
        help="markdown file to update (default: BENCHMARKS.md, except with --quick)",
    )
    p.add_argument("--no-markdown", action="store_true")
    p.add_argument("--strict", action="store_true", help="exit 1 when a measured target is missed")
    p.add_argument("--work", type=Path, default=None, help="working directory (kept)")
    p.add_argument(
        "--drop-caches",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="drop the page cache before warm measures (default: yes; not with --quick)",
    )
    return p.parse_args(argv)


def settings_from(ns: argparse.Namespace, work: Path) -> Settings:
    """Settings from the command line, with the ``--quick`` defaults applied.

    Raises:
        ValueError: A value is invalid.
    """
    groups = tuple(g.strip() for g in ns.only.split(",") if g.strip())
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        raise ValueError(f"unknown scenario group(s): {', '.join(unknown)}")
    return Settings(
        size_bytes=parse_size(ns.size or ("16MiB" if ns.quick else "1GiB")),
        link=LinkSpec(ns.rtt_ms / 1000, parse_rate(ns.rate), ns.jitter_ms / 1000),
        steps=ns.steps or (3 if ns.quick else 100),
        workers=ns.workers if ns.workers is not None else (0 if ns.quick else 2),
        batch_size=ns.batch_size,
        fio_runtime_s=ns.fio_runtime or (1.0 if ns.quick else 8.0),
        cold_cap_s=ns.cold_cap,
        groups=tuple(g for g in GROUPS if g in groups),
        cache_dir=ns.data_cache or default_cache_dir(),
        work=work,
        drop_caches=ns.drop_caches if ns.drop_caches is not None else not ns.quick,
        trainer_rows=QUICK_TRAINER_ROWS if ns.quick else None,
        trainer_repeat=max(1, ns.trainer_repeat or (1 if ns.quick else 3)),
        quick=ns.quick,
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    raw = sys.argv[1:] if argv is None else argv
    ns = parse_args(raw)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    work = ns.work or Path(tempfile.mkdtemp(prefix="strata-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        settings = settings_from(ns, work)
    except ValueError as err:
        print(f"bench.run: error: {err}", file=sys.stderr)
        return 2
    markdown: Path | None = ns.markdown
    if markdown is None and not ns.quick:
        markdown = REPO_ROOT / "BENCHMARKS.md"
    if ns.no_markdown:
        markdown = None
    t0 = time.monotonic()

    def echo(text: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f} s] {text}" if text else "", flush=True)

    try:
        result = run_suite(settings, echo)
        result["command"] = shlex.join(["python", "-m", "bench.run", *raw])
        write_outputs(result, ns.results, markdown, print)
        missed = [t["name"] for t in result["targets"] if t["met"] is False]
        if ns.strict and missed:
            print(f"bench.run: missed: {'; '.join(missed)}", file=sys.stderr)
            return 1
        return 0
    except (BenchError, DataError, StackError, OSError) as err:
        print(f"bench.run: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench.run: interrupted; cleaned up", file=sys.stderr)
        return 130
    finally:
        if ns.work is None:
            _remove_work(work)


def _remove_work(work: Path) -> None:
    """Delete the working directory, never descending into a mount left attached."""
    for mnt in work.glob("mnt-*"):
        if is_mounted(mnt):
            lazy_unmount(mnt)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
