"""The measures scenarios are made of: first byte, fio jobs, trainer runs, the cold pass.

Each writes into a :class:`~bench.scenarios.base.Row` and logs one line through the
context. :func:`cold_record` is the one place the ``cold`` field of a row is built (the
copy-first download and the remote file systems' cold passes share its shape).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from bench import fio
from bench.measure import (
    LinkSampler,
    link_utilisation,
    read_pass,
    run_trainer,
    steady_state,
    time_to_first_byte,
    tree_cpu_seconds,
)
from bench.scenarios.base import Context, Row


def chunks_dir(root: Path) -> Path:
    """The synthetic volume's amplitude chunk directory under a file system's ``root``."""
    return root / "synth.mdio" / "amplitude" / "c"


def cpu_since(fs_pid: int | None, cpu0: float) -> float | None:
    """CPU seconds the file system's process tree used since it had used ``cpu0``."""
    return tree_cpu_seconds(fs_pid) - cpu0 if fs_pid else None


def first_byte(ctx: Context, row: Row, root: Path) -> None:
    """Time to first byte of the context's first-byte file under ``root``."""
    row.first_byte_s = time_to_first_byte(root / ctx.first_byte_file)
    ctx.echo(f"    first byte {row.first_byte_s:.3f} s")


def fio_jobs(
    ctx: Context, row: Row, root: Path, page_cache: str, fs_pid: int | None = None
) -> None:
    """The three fio jobs over ``root``'s chunk files, into ``row.fio``.

    ``fs_pid`` is the file system's process: its CPU time during each job is recorded.
    """
    if not fio.available():
        row.notes.append("fio not installed: no fio figures")
        return
    for job in fio.JOBS:
        if page_cache == "dropped":
            ctx.drop()
        cpu0 = tree_cpu_seconds(fs_pid)
        result = fio.run_job(
            job,
            chunks_dir(root),
            ctx.settings.work / "fio" / row.name,
            ctx.settings.fio_runtime_s if job != "seq_1m" else ctx.settings.cold_cap_s,
            page_cache=page_cache,
            timeout_s=4 * ctx.settings.cold_cap_s + 60,
        )
        row.fio[job] = result.to_dict()
        row.fio[job]["fs_cpu_s"] = cpu_since(fs_pid, cpu0)
        ctx.echo(f"    fio {job:8s} {result.mb_s:9.1f} MB/s  {result.iops:9.0f} IOPS")


def trainer(
    ctx: Context,
    row: Row,
    root: Path,
    tag: str,
    fs_pid: int | None = None,
    extra: tuple[str, ...] = (),
    ranks: int = 1,
) -> None:
    """Train on ``root/synth.mdio`` into ``row.trainer`` (unless the settings skip this row).

    A row trained more than once (see :func:`repeat_warm_vs_local`) reports the medians
    of its runs' samples/s, data-wait fraction and time to first batch.
    ``fs_pid`` is the file system's process: its CPU time during training is recorded.
    ``extra`` and ``ranks`` go to :func:`bench.measure.run_trainer` (hints, torchrun).
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
        extra=extra,
        ranks=ranks,
    )
    this = run.to_dict()
    this["fs_cpu_s"] = cpu_since(fs_pid, cpu0)
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


def repeat_warm_vs_local(ctx: Context, warm: Row, root: Path, fs_pid: int | None) -> None:
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
        trainer(ctx, local, ctx.data.root, "warm")
        ctx.drop()
        trainer(ctx, warm, root, "warm", fs_pid)


def cold_record(
    ctx: Context,
    sampler: LinkSampler,
    t0: float,
    t1: float,
    nbytes: int,
    complete: bool,
    **extra: Any,
) -> dict[str, Any]:
    """The ``cold`` field of a row: a first read of ``nbytes`` between ``t0`` and ``t1``.

    Args:
        ctx: The run (its link's rate gives the utilisation).
        sampler: The link's sampler, marked at ``t0`` and ``t1`` (monotonic seconds).
        t0: Start of the phase.
        t1: End of the phase.
        nbytes: Bytes the reader got.
        complete: Whether every byte of the volume was read.
        **extra: Further fields of this kind of phase (e.g. ``files`` copied).

    Returns:
        Seconds, bytes read, MB/s, the link's 1 s bins, time to steady state and
        steady MB/s (:func:`bench.measure.steady_state`), bytes each way over the link
        and its utilisation, then ``extra``.
    """
    seconds = t1 - t0
    down = sampler.down_bytes(t0, t1)
    bins = sampler.bins_mb_s(t0, t1)
    steady_s, steady = steady_state(bins)
    return {
        "seconds": seconds,
        "bytes_read": nbytes,
        "complete": complete,
        "mb_s": nbytes / seconds / 1e6,
        "bins_mb_s": bins,
        "steady_state_s": steady_s,
        "steady_mb_s": steady,
        "link_down_bytes": down,
        "link_up_bytes": sampler.up_bytes(t0, t1),
        "link_utilisation": link_utilisation(down, seconds, ctx.settings.link.rate_bps),
        **extra,
    }


def cold_pass(ctx: Context, row: Row, root: Path, sampler: LinkSampler, fs_pid: int | None) -> None:
    """A sequential fio pass on an empty cache, logged in 1 s bins, into ``row.cold``.

    The throughput curve is the link's, in 1 s bins from the moment fio starts: fio's
    own bandwidth log begins only after it has listed and opened every file, which on a
    cold remote file system can take a while and belongs to the pass.
    """
    chunks = chunks_dir(root)
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
    row.cold = cold = cold_record(
        ctx,
        sampler,
        t0,
        t1,
        nbytes,
        nbytes >= ctx.synth_bytes,
        fio_bins_mb_s=fio_bins,
        fs_cpu_s=cpu_since(fs_pid, cpu0),
    )
    ctx.echo(
        f"    cold pass {nbytes / 2**20:,.0f} MiB in {cold['seconds']:.1f} s "
        f"({cold['mb_s']:.1f} MB/s, link use {100 * cold['link_utilisation']:.0f} %, "
        f"steady after {cold['steady_state_s']:.0f} s at {cold['steady_mb_s']:.1f} MB/s)"
    )
    if not cold["complete"]:
        row.notes.append(f"cold pass cut at {ctx.settings.cold_cap_s:.0f} s")
        ctx.echo("    finishing the warm-up the cold pass left undone")
        read_pass(chunks, fio.WORKERS)
