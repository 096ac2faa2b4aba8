"""Strata side by side with local disk, copy-first, rclone and httpdirfs, over one emulated WAN.

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
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from bench import fio, report
from bench.copy_first import CopyError
from bench.data import DataError, Dataset, default_cache_dir, ensure_dataset, parse_size
from bench.measure import (
    LinkSampler,
    TrainerError,
    drop_page_cache,
    link_utilisation,
    read_pass,
    run_trainer,
    steady_state,
    time_to_first_byte,
    tree_cpu_seconds,
)
from bench.mounts import HttpdirfsMount, MountError, RcloneMount, StrataMount, tool_version
from bench.wan import LinkSpec, WanProxy, parse_hostport, parse_rate
from deploy.local import LocalStack, StackError, publish
from spoke.supervisor import is_mounted, lazy_unmount

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "bench" / "results"
DATASET = "bench"

GROUPS = ("local", "copy-first", "strata", "rclone", "httpdirfs")
"""Scenario groups, in the order they run (``--only`` picks among them)."""

LABELS = {
    "local": "local disk",
    "copy-first": "copy-first",
    "strata-cold": "Strata cold",
    "strata-warm": "Strata warm (page cache kept)",
    "strata-warm-dropped": "Strata warm (page cache dropped)",
    "rclone-cold": "rclone cold",
    "rclone-warm": "rclone warm (page cache dropped)",
    "httpdirfs-cold": "httpdirfs cold",
    "httpdirfs-warm": "httpdirfs warm (page cache dropped)",
}
ROWS = {
    "local": ("local",),
    "copy-first": ("copy-first",),
    "strata": ("strata-cold", "strata-warm", "strata-warm-dropped"),
    "rclone": ("rclone-cold", "rclone-warm"),
    "httpdirfs": ("httpdirfs-cold", "httpdirfs-warm"),
}

QUICK_TRAINER_ROWS = frozenset({"local", "strata-cold", "strata-warm-dropped"})
"""With ``--quick`` the trainer runs only here (each run costs seconds of start-up, and
httpdirfs's cold one tens of seconds of listing)."""


class BenchError(RuntimeError):
    """A step of the harness failed; the message says which."""


@dataclass
class Settings:
    """Everything a run depends on (recorded in the result).

    Attributes:
        size_bytes: Size of the synthetic volume.
        link: The emulated link.
        steps: Trainer steps per run.
        workers: Trainer DataLoader workers.
        batch_size: Trainer batch size.
        fio_runtime_s: Duration of each random fio job.
        cold_cap_s: Longest a cold sequential pass may run (then it is cut short).
        groups: Scenario groups to run.
        cache_dir: Where generated data sets are kept.
        work: Working directory (hub data, caches, mounts, copies).
        drop_caches: Drop the page cache where the scenarios say so (needs root).
        trainer_rows: Rows that run the trainer; ``None`` for every row.
        trainer_repeat: Trainer runs of local disk and of warm Strata (page cache
            dropped), alternating; both rows report medians.
        quick: The small smoke-test version.
    """

    size_bytes: int
    link: LinkSpec
    steps: int
    workers: int
    batch_size: int
    fio_runtime_s: float
    cold_cap_s: float
    groups: tuple[str, ...]
    cache_dir: Path
    work: Path
    drop_caches: bool = True
    trainer_rows: frozenset[str] | None = None
    trainer_repeat: int = 1
    quick: bool = False


@dataclass
class Row:
    """One scenario's results (a line of the table)."""

    name: str
    status: str = "ok"
    reason: str = ""
    page_cache: str = ""
    first_byte_s: float | None = None
    first_batch_s: float | None = None
    trainer: dict[str, Any] | None = None
    trainer_link_bytes: int | None = None
    fio: dict[str, dict[str, Any]] = field(default_factory=dict)
    cold: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        """Human name for tables and plots."""
        return LABELS.get(self.name, self.name)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields, the label included."""
        return {"label": self.label, **asdict(self)}


@dataclass
class Context:
    """What the scenarios share: data, settings, links, samplers, a log function."""

    settings: Settings
    data: Dataset
    hub_link: WanProxy | None = None
    hub_sampler: LinkSampler | None = None
    http_link: WanProxy | None = None
    http_sampler: LinkSampler | None = None
    version: str = "v1"
    can_drop: bool = False
    rows: dict[str, Row] = field(default_factory=dict)
    echo: Callable[[str], None] = print

    @property
    def first_byte_file(self) -> str:
        """Relative path of the file whose first byte is timed."""
        if self.data.f3 is not None:
            return "f3.mdio/amplitude/c/0/0/0"
        return "synth.mdio/amplitude/c/0/0/0"

    @property
    def synth_bytes(self) -> int:
        """Bytes of the synthetic volume's amplitude chunks (what the cold pass reads)."""
        return sum(p.stat().st_size for p in self.data.amplitude_chunks.rglob("*") if p.is_file())

    def drop(self) -> None:
        """Drop the page cache (when permitted)."""
        if self.can_drop:
            drop_page_cache()


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


# --------------------------------------------------------------------------- measures


def _fio_jobs(
    ctx: Context, row: Row, root: Path, page_cache: str, fs_pid: int | None = None
) -> None:
    """The three fio jobs over ``root``'s chunk files, into ``row.fio``.

    ``fs_pid`` is the file system's process: its CPU time during each job is recorded.
    """
    if not fio.available():
        row.notes.append("fio not installed: no fio figures")
        return
    chunks = root / "synth.mdio" / "amplitude" / "c"
    for job in fio.JOBS:
        if page_cache == "dropped":
            ctx.drop()
        cpu0 = tree_cpu_seconds(fs_pid)
        result = fio.run_job(
            job,
            chunks,
            ctx.settings.work / "fio" / row.name,
            ctx.settings.fio_runtime_s if job != "seq_1m" else ctx.settings.cold_cap_s,
            page_cache=page_cache,
            timeout_s=4 * ctx.settings.cold_cap_s + 60,
        )
        row.fio[job] = result.to_dict()
        row.fio[job]["fs_cpu_s"] = tree_cpu_seconds(fs_pid) - cpu0 if fs_pid else None
        ctx.echo(f"    fio {job:8s} {result.mb_s:9.1f} MB/s  {result.iops:9.0f} IOPS")


def _trainer(ctx: Context, row: Row, root: Path, tag: str, fs_pid: int | None = None) -> None:
    """Train on ``root/synth.mdio`` into ``row.trainer`` (unless the settings skip this row).

    A row trained more than once (see :func:`_repeat_warm_vs_local`) reports the medians
    of its runs' samples/s, data-wait fraction and time to first batch.
    ``fs_pid`` is the file system's process: its CPU time during training is recorded.
    """
    only = ctx.settings.trainer_rows
    if only is not None and row.name not in only:
        row.notes.append("trainer not run in this row (--quick)")
        return
    runs: list[dict[str, Any]] = row.trainer["runs"] if row.trainer else []
    cpu0 = tree_cpu_seconds(fs_pid)
    run = run_trainer(
        root / "synth.mdio",
        ctx.settings.work / "train" / f"{row.name}-{tag}-{len(runs) + 1}",
        ctx.settings.steps,
        workers=ctx.settings.workers,
        batch_size=ctx.settings.batch_size,
    )
    this = run.to_dict()
    this["fs_cpu_s"] = tree_cpu_seconds(fs_pid) - cpu0 if fs_pid else None
    runs.append(this)
    row.trainer = {**runs[0], "runs": runs}
    for key in ("samples_per_s", "data_wait_fraction", "fs_cpu_s"):
        values = [r[key] for r in runs if r[key] is not None]
        row.trainer[key] = statistics.median(values) if values else None
    row.first_batch_s = statistics.median(r["time_to_first_batch_s"] for r in runs)
    ctx.echo(
        f"    trainer: first batch {run.time_to_first_batch_s:.2f} s, "
        f"{run.samples_per_s:.1f} samples/s, data wait {100 * run.data_wait_fraction:.1f} %"
    )


def _repeat_warm_vs_local(ctx: Context, warm: Row, root: Path, fs_pid: int | None) -> None:
    """Train on local disk and on the warm mount alternately, ``trainer_repeat - 1`` more times.

    The trainer target (warm ≥ 0.98× local) is a small difference on a noisy machine:
    alternating the two, each after dropping the page cache, spreads any drift over both,
    and both rows then report medians.
    """
    local = ctx.rows.get("local")
    if local is None or local.trainer is None or warm.trainer is None:
        return
    for i in range(ctx.settings.trainer_repeat - 1):
        ctx.echo(f"    trainer, local vs warm Strata, repeat {i + 2}")
        ctx.drop()
        _trainer(ctx, local, ctx.data.root, "warm")
        ctx.drop()
        _trainer(ctx, warm, root, "warm", fs_pid)


def _first_byte(ctx: Context, row: Row, root: Path) -> None:
    row.first_byte_s = time_to_first_byte(root / ctx.first_byte_file)
    ctx.echo(f"    first byte {row.first_byte_s:.3f} s")


def _cold_pass(
    ctx: Context, row: Row, root: Path, sampler: LinkSampler, fs_pid: int | None
) -> None:
    """A sequential fio pass on an empty cache, logged in 1 s bins, into ``row.cold``.

    The throughput curve is the link's, in 1 s bins from the moment fio starts: fio's
    own bandwidth log begins only after it has listed and opened every file, which on a
    cold remote file system can take a while and belongs to the pass.
    """
    chunks = root / "synth.mdio" / "amplitude" / "c"
    ctx.drop()
    cpu0 = tree_cpu_seconds(fs_pid)
    t0 = sampler.mark()
    if fio.available():
        result = fio.run_job(
            "seq_1m",
            chunks,
            ctx.settings.work / "fio" / f"{row.name}-pass",
            ctx.settings.cold_cap_s,
            log_bins=True,
            timeout_s=ctx.settings.cold_cap_s + 120,
        )
        nbytes, fio_bins = result.bytes, result.bins_mb_s
        row.fio["seq_1m"] = result.to_dict()
    else:
        nbytes, fio_bins = read_pass(chunks, fio.WORKERS), []
        row.notes.append("cold pass read by Python threads (fio not installed)")
    t1 = sampler.mark()
    down = sampler.down_bytes(t0, t1)
    bins = sampler.bins_mb_s(t0, t1)
    steady_s, steady = steady_state(bins)
    row.cold = {
        "seconds": t1 - t0,
        "bytes_read": nbytes,
        "complete": nbytes >= ctx.synth_bytes,
        "mb_s": nbytes / (t1 - t0) / 1e6,
        "bins_mb_s": bins,
        "fio_bins_mb_s": fio_bins,
        "fs_cpu_s": tree_cpu_seconds(fs_pid) - cpu0 if fs_pid else None,
        "steady_state_s": steady_s,
        "steady_mb_s": steady,
        "link_down_bytes": down,
        "link_up_bytes": sampler.up_bytes(t0, t1),
        "link_utilisation": link_utilisation(down, t1 - t0, ctx.settings.link.rate_bps),
    }
    ctx.echo(
        f"    cold pass {nbytes / 2**20:,.0f} MiB in {t1 - t0:.1f} s "
        f"({row.cold['mb_s']:.1f} MB/s, link use {100 * row.cold['link_utilisation']:.0f} %, "
        f"steady after {steady_s:.0f} s at {steady:.1f} MB/s)"
    )
    if not row.cold["complete"]:
        row.notes.append(f"cold pass cut at {ctx.settings.cold_cap_s:.0f} s")
        ctx.echo("    finishing the warm-up the cold pass left undone")
        read_pass(chunks, fio.WORKERS)


# --------------------------------------------------------------------------- scenarios


def run_local(ctx: Context) -> list[Row]:
    """The co-located baseline: the source tree on this node's disk."""
    row = Row("local", page_cache="dropped" if ctx.can_drop else "kept")
    root = ctx.data.root
    ctx.drop()
    _first_byte(ctx, row, root)
    _fio_jobs(ctx, row, root, row.page_cache)
    ctx.drop()
    _trainer(ctx, row, root, "warm")
    return [row]


def run_copy_first(ctx: Context) -> list[Row]:
    """Download everything over the link, then read locally."""
    assert ctx.http_link is not None and ctx.http_sampler is not None
    row = Row("copy-first", page_cache="dropped" if ctx.can_drop else "kept")
    dest = ctx.settings.work / "copy"
    shutil.rmtree(dest, ignore_errors=True)
    out = ctx.settings.work / "copy.json"
    ctx.drop()
    t0 = ctx.http_sampler.mark()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.copy_first",
            f"http://{ctx.http_link.address}/",
            str(dest),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    t1 = ctx.http_sampler.mark()
    if proc.returncode != 0:
        raise CopyError(proc.stderr.strip() or f"copy exited {proc.returncode}")
    copied = json.loads(out.read_text())
    copy_s = t1 - t0
    down = ctx.http_sampler.down_bytes(t0, t1)
    bins = ctx.http_sampler.bins_mb_s(t0, t1)
    steady_s, steady = steady_state(bins)
    row.cold = {
        "seconds": copy_s,
        "bytes_read": copied["bytes"],
        "complete": True,
        "mb_s": copied["bytes"] / copy_s / 1e6,
        "bins_mb_s": bins,
        "steady_state_s": steady_s,
        "steady_mb_s": steady,
        "link_down_bytes": down,
        "link_up_bytes": ctx.http_sampler.up_bytes(t0, t1),
        "link_utilisation": link_utilisation(down, copy_s, ctx.settings.link.rate_bps),
        "files": copied["files"],
    }
    ctx.echo(
        f"    copied {copied['files']:,} files, {copied['bytes'] / 2**20:,.0f} MiB in "
        f"{copy_s:.1f} s (link use {100 * row.cold['link_utilisation']:.0f} %)"
    )
    ctx.drop()
    row.first_byte_s = copy_s + time_to_first_byte(dest / ctx.first_byte_file)
    ctx.drop()
    _trainer(ctx, row, dest, "cold")
    if row.trainer is not None:
        row.first_batch_s = copy_s + row.trainer["time_to_first_batch_s"]
    row.notes.append("fio not rerun: once copied, the files are local disk (see local)")
    shutil.rmtree(dest, ignore_errors=True)
    return [row]


@contextlib.contextmanager
def _mounted(factory: Callable[[], Any]) -> Iterator[Any]:
    mount = factory()
    mount.start()
    try:
        yield mount
    finally:
        mount.stop()


def _remote(
    ctx: Context,
    tool: str,
    factory: Callable[[], Any],
    root_of: Callable[[Any], Path],
    sampler: LinkSampler,
) -> list[Row]:
    """Cold and warm rows of one remote file system.

    1. fresh mount, empty cache: time to first byte, then the trainer (cold);
    2. fresh mount, empty cache again: the sequential cold pass (fio, 1 s bins);
    3. warm: for Strata first with the page cache as the pass left it, then (every
       tool) with the page cache dropped before each measure.
    """
    cold = Row(f"{tool}-cold", page_cache="cold")
    rows = [cold]
    ctx.drop()
    with _mounted(factory) as mount:
        root = root_of(mount)
        _first_byte(ctx, cold, root)
        t0 = sampler.mark()
        _trainer(ctx, cold, root, "cold", mount.pid)
        cold.trainer_link_bytes = sampler.down_bytes(t0, sampler.mark())
    with _mounted(factory) as mount:
        root = root_of(mount)
        _cold_pass(ctx, cold, root, sampler, mount.pid)
        if tool == "strata":
            kept = Row("strata-warm", page_cache="kept")
            rows.append(kept)
            ctx.echo("  Strata warm, page cache kept")
            _first_byte(ctx, kept, root)
            _fio_jobs(ctx, kept, root, "kept", mount.pid)
            _trainer(ctx, kept, root, "warm", mount.pid)
        warm = Row(f"{tool}-warm-dropped" if tool == "strata" else f"{tool}-warm")
        warm.page_cache = "dropped" if ctx.can_drop else "kept"
        rows.append(warm)
        ctx.echo(f"  {warm.label}")
        t0 = sampler.mark()
        ctx.drop()
        _first_byte(ctx, warm, root)
        _fio_jobs(ctx, warm, root, warm.page_cache, mount.pid)
        ctx.drop()
        _trainer(ctx, warm, root, "warm", mount.pid)
        if tool == "strata":
            _repeat_warm_vs_local(ctx, warm, root, mount.pid)
        warm_bytes = sampler.down_bytes(t0, sampler.mark())
        warm.notes.append(f"{warm_bytes:,} bytes over the link while warm")
        if tool == "strata":
            admin = getattr(mount, "admin", "")
            warm.notes.append(f"spoke cache: {_cache_stats(admin)}")
    return rows


def _cache_stats(admin: str) -> dict[str, Any]:
    import httpx

    try:
        stats: dict[str, Any] = httpx.get(f"{admin}/v1/cache", timeout=10).json()
    except (httpx.HTTPError, ValueError) as err:
        return {"error": str(err)}
    keys = ("hits", "misses", "hub_fetch_bytes", "used_bytes")
    return {k: stats[k] for k in keys if k in stats}


def run_strata(ctx: Context) -> list[Row]:
    """Strata cold, warm (page cache kept) and warm (page cache dropped)."""
    assert ctx.hub_link is not None and ctx.hub_sampler is not None
    work = ctx.settings.work
    hub = ctx.hub_link.address
    cache_size = f"{2 * ctx.data.bytes // 2**20 + 256}MiB"  # everything fits: no eviction

    def factory() -> StrataMount:
        return StrataMount(hub, work / "mnt-strata", work / "cache-strata", cache_size)

    def root_of(mount: StrataMount) -> Path:
        return mount.mount / DATASET / ctx.version

    return _remote(ctx, "strata", factory, root_of, ctx.hub_sampler)


def run_rclone(ctx: Context) -> list[Row]:
    """rclone mount with the full VFS cache over HTTP through the link."""
    assert ctx.http_link is not None and ctx.http_sampler is not None
    work = ctx.settings.work
    url = f"http://{ctx.http_link.address}/"

    def factory() -> RcloneMount:
        return RcloneMount(url, work / "mnt-rclone", work / "cache-rclone", work / "rclone.log")

    return _remote(ctx, "rclone", factory, lambda m: m.mount, ctx.http_sampler)


def run_httpdirfs(ctx: Context) -> list[Row]:
    """httpdirfs with its cache over HTTP through the link."""
    assert ctx.http_link is not None and ctx.http_sampler is not None
    work = ctx.settings.work
    url = f"http://{ctx.http_link.address}/"

    def factory() -> HttpdirfsMount:
        return HttpdirfsMount(
            url, work / "mnt-httpdirfs", work / "cache-httpdirfs", work / "httpdirfs.log"
        )

    return _remote(ctx, "httpdirfs", factory, lambda m: m.mount, ctx.http_sampler)


RUNNERS: dict[str, Callable[[Context], list[Row]]] = {
    "local": run_local,
    "copy-first": run_copy_first,
    "strata": run_strata,
    "rclone": run_rclone,
    "httpdirfs": run_httpdirfs,
}


def missing_tools(group: str) -> str:
    """Why ``group`` cannot run here (empty when it can)."""
    fuse = os.path.exists("/dev/fuse") and shutil.which("fusermount3") is not None
    if group in ("strata", "rclone", "httpdirfs") and not fuse:
        return "no /dev/fuse or fusermount3"
    if group in ("rclone", "httpdirfs") and shutil.which(group) is None:
        return f"{group} not installed (make bench-deps)"
    return ""


# --------------------------------------------------------------------------- targets


def _get(rows: dict[str, Row], name: str) -> Row | None:
    row = rows.get(name)
    return row if row is not None and row.status == "ok" else None


def _fio_mb_s(row: Row | None, job: str) -> float | None:
    if row is None or job not in row.fio:
        return None
    value: float = row.fio[job]["mb_s"]
    return value


def targets(rows: dict[str, Row], link: LinkSpec) -> list[dict[str, Any]]:
    """The DESIGN.md goals with what this run measured (goals, not assertions)."""
    out: list[dict[str, Any]] = []

    def add(name: str, goal: str, measured: str, met: bool | None) -> None:
        out.append({"name": name, "goal": goal, "measured": measured, "met": met})

    local, warm = _get(rows, "local"), _get(rows, "strata-warm-dropped")
    cold, copy = _get(rows, "strata-cold"), _get(rows, "copy-first")
    lseq, wseq = _fio_mb_s(local, "seq_1m"), _fio_mb_s(warm, "seq_1m")
    if lseq and wseq is not None:
        r = wseq / lseq
        add("warm seq read vs local (page cache dropped)", "≥ 0.75×", f"{r:.2f}×", r >= 0.75)
    else:
        add("warm seq read vs local (page cache dropped)", "≥ 0.75×", "not measured", None)
    if local and warm and local.trainer and warm.trainer:
        r = warm.trainer["samples_per_s"] / local.trainer["samples_per_s"]
        add("trainer samples/s, warm vs local", "≥ 0.98×", f"{r:.2f}×", r >= 0.98)
        dw = warm.trainer["data_wait_fraction"] - local.trainer["data_wait_fraction"]
        add("data-wait fraction, warm − local", "≤ +1 point", f"{100 * dw:+.1f} points", dw <= 0.01)
    else:
        add("trainer samples/s, warm vs local", "≥ 0.98×", "not measured", None)
    if cold and cold.first_batch_s is not None:
        base = 0.0  # local disk's start-up (median over its runs): not the file system's
        if local and local.trainer:
            base = statistics.median(r["time_to_first_batch_s"] for r in local.trainer["runs"])
        extra = cold.first_batch_s - base
        text = f"{cold.first_batch_s:.2f} s ({extra:+.2f} s vs local's {base:.2f} s)"
        if copy and copy.first_batch_s is not None:
            text += f"; copy-first {copy.first_batch_s:.1f} s"
        add("cold first batch (beyond local's start-up)", "≤ 2 s", text, extra <= 2.0)
    if cold and cold.cold:
        u = cold.cold["link_utilisation"]
        add(f"cold link use ({link.describe()})", "≥ 80 %", f"{100 * u:.0f} %", u >= 0.8)
    for other in ("rclone-warm", "httpdirfs-warm"):
        row = _get(rows, other)
        if warm is None or row is None:
            continue
        worse = []
        parts = []
        for job in fio.JOBS:
            a, b = _fio_mb_s(warm, job), _fio_mb_s(row, job)
            if a is None or b is None:
                continue
            parts.append(f"{job} {a / b:.2f}×" if b else f"{job} –")
            if a < b:
                worse.append(job)
        if parts:
            add(f"Strata warm ≥ {other} on every fio job", "≥ 1×", ", ".join(parts), not worse)
    return out


# --------------------------------------------------------------------------- the run


def machine_info() -> dict[str, Any]:
    """CPU, cores, memory, OS and kernel of this machine."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory = 0.0
    with contextlib.suppress(OSError, ValueError, IndexError):
        memory = int(Path("/proc/meminfo").read_text().split()[1]) / 2**20
    os_name = platform.platform()
    with contextlib.suppress(OSError):
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                os_name = line.split("=", 1)[1].strip('"')
    load = os.getloadavg()[0]
    return {
        "cpu": cpu,
        "cores": os.cpu_count() or 1,
        "memory_gib": memory,
        "os": os_name,
        "kernel": platform.release(),
        "load_1min_at_start": load,
        "shared": load > 0.5 * (os.cpu_count() or 1),
    }


def versions() -> dict[str, str]:
    """Versions of Strata (git commit), Python and every tool involved."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as pkg_version

    def pkg(name: str) -> str:
        try:
            return pkg_version(name)
        except PackageNotFoundError:
            return ""

    commit = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return {
        "strata": f"{pkg('strata')} ({commit})" if commit else pkg("strata"),
        "python": platform.python_version(),
        "torch": pkg("torch"),
        "zarr": pkg("zarr"),
        "fio": fio.version(),
        "rclone": tool_version("rclone"),
        "httpdirfs": tool_version("httpdirfs"),
        "fusermount3": tool_version("fusermount3"),
    }


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


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def run_suite(settings: Settings, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Run every selected scenario; returns the result dictionary (not yet written).

    Raises:
        BenchError, DataError, StackError: Setting up the data, hub or links failed.
    """
    started = datetime.datetime.now(datetime.UTC)
    t_start = time.monotonic()
    machine = machine_info()
    data = ensure_dataset(settings.cache_dir, settings.size_bytes, echo=echo)
    can_drop = settings.drop_caches and drop_page_cache()
    ctx = Context(settings=settings, data=data, can_drop=can_drop, echo=echo)
    rows: list[Row] = []
    group_s: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        needs_hub = "strata" in settings.groups and not missing_tools("strata")
        needs_http = any(g in settings.groups for g in ("copy-first", "rclone", "httpdirfs"))
        if needs_hub:
            echo(f"==> publishing {data.files:,} files ({data.bytes / 2**20:,.0f} MiB) to a hub")
            ctx.version = publish(settings.work / "hub", DATASET, data.root, "--tag", "latest")
            hub = stack.enter_context(LocalStack()).start_hub(settings.work / "hub")
            ctx.hub_link = stack.enter_context(WanProxy(parse_hostport(hub), settings.link))
            ctx.hub_sampler = stack.enter_context(LinkSampler(ctx.hub_link))
        if needs_http:
            proc, port = _start_http_source(data.root, settings.work)
            stack.callback(_stop, proc)
            ctx.http_link = stack.enter_context(WanProxy(("127.0.0.1", port), settings.link))
            ctx.http_sampler = stack.enter_context(LinkSampler(ctx.http_link))
        for group in settings.groups:
            why = missing_tools(group)
            if why:
                echo(f"==> {group}: skipped ({why})")
                rows += [Row(n, status="skipped", reason=why) for n in ROWS[group]]
                continue
            echo(f"==> {group}")
            t_group = time.monotonic()
            try:
                rows += RUNNERS[group](ctx)
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
                    for n in ROWS[group]
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
