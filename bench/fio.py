"""fio jobs over the benchmark's chunk files, and what they measured.

Three jobs, each with four workers (fio ``numjobs``/sections), synchronous ``psync`` reads
through the page cache (``direct=0``: FUSE file systems are read that way by applications):

* ``seq_1m``: sequential 1 MiB reads; worker *k* reads inline chunk row *k*
  (``amplitude/c/<k>/``, a quarter of the volume), every file from start to end;
* ``rand_4k``: random 4 KiB reads over all chunk files, for ``runtime`` seconds;
* ``rand_1m``: random 1 MiB reads (a whole chunk file each), for ``runtime`` seconds.

A sequential pass can also log its bandwidth once a second (``write_bw_log``), which is how
the cold passes get their throughput-over-time curves.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

JOBS = ("seq_1m", "rand_4k", "rand_1m")
"""The fio jobs, in the order they run and are reported."""

WORKERS = 4
"""fio workers per job."""


class FioError(RuntimeError):
    """fio failed; the message has the end of its error output."""


@dataclass(frozen=True)
class FioResult:
    """One fio job's aggregate over its workers.

    Attributes:
        job: Job name (one of :data:`JOBS`).
        bytes: Bytes read.
        seconds: Run time, seconds.
        mb_s: Read throughput, MB/s (10^6 bytes per second).
        iops: Read operations per second.
        lat_p50_ms: Median completion latency of one read, ms.
        lat_p99_ms: 99th percentile completion latency of one read, ms.
        bins_mb_s: Throughput of each 1 s interval (only when logged).
        page_cache: ``"dropped"`` or ``"kept"``.
        command: The fio command line.
    """

    job: str
    bytes: int
    seconds: float
    mb_s: float
    iops: float
    lat_p50_ms: float
    lat_p99_ms: float
    bins_mb_s: list[float]
    page_cache: str
    command: list[str]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return dict(self.__dict__)


def available() -> bool:
    """Whether the ``fio`` command is installed."""
    return shutil.which("fio") is not None


def version() -> str:
    """fio's version number (``3.33``), or ``""`` when fio is missing."""
    if not available():
        return ""
    out = subprocess.run(["fio", "--version"], capture_output=True, text=True).stdout.strip()
    return out.removeprefix("fio-")


def job_args(job: str, chunks_dir: Path, runtime_s: float | None) -> list[str]:
    """The fio options of ``job`` over the chunk directories under ``chunks_dir``.

    Args:
        job: One of :data:`JOBS`.
        chunks_dir: ``synth.mdio/amplitude/c`` on the file system under test.
        runtime_s: For ``seq_1m`` a cap (the pass stops early if it takes longer);
            for the random jobs the exact duration.

    Raises:
        ValueError: Unknown job.
    """
    common = ["--ioengine=psync", "--direct=0"]
    if job == "seq_1m":
        args = [*common, "--rw=read", "--bs=1M", "--file_service_type=sequential"]
        if runtime_s:
            args.append(f"--runtime={max(1, round(runtime_s))}")
        for k in range(WORKERS):
            args += [f"--name=seq_1m.{k}", f"--opendir={chunks_dir / str(k)}"]
        return args
    if job in ("rand_4k", "rand_1m"):
        bs = "4k" if job == "rand_4k" else "1M"
        return [
            *common,
            "--rw=randread",
            f"--bs={bs}",
            "--file_service_type=random",
            "--time_based",
            f"--runtime={max(1, round(runtime_s or 10))}",
            f"--name={job}",
            f"--opendir={chunks_dir}",
            f"--numjobs={WORKERS}",
        ]
    raise ValueError(f"unknown fio job {job!r}")


def run_job(
    job: str,
    chunks_dir: Path,
    work: Path,
    runtime_s: float | None,
    page_cache: str = "dropped",
    log_bins: bool = False,
    timeout_s: float | None = None,
) -> FioResult:
    """Run one job and parse its JSON output.

    Args:
        job: One of :data:`JOBS`.
        chunks_dir: See :func:`job_args`.
        work: Directory for fio's output and logs.
        runtime_s: See :func:`job_args`.
        page_cache: ``"dropped"`` lets fio drop each file's cached pages when it opens
            it (``invalidate=1``; the caller also drops the whole page cache first);
            ``"kept"`` reads through whatever the page cache holds (``invalidate=0``).
        log_bins: Also log the bandwidth of every 1 s interval.
        timeout_s: Kill fio after this long.

    Raises:
        FioError: fio failed or printed no result.
    """
    work.mkdir(parents=True, exist_ok=True)
    out = work / f"{job}.json"
    cmd = ["fio", "--output-format=json", f"--output={out}", "--group_reporting"]
    cmd.append(f"--invalidate={1 if page_cache == 'dropped' else 0}")
    prefix = work / f"{job}"
    if log_bins:
        cmd += [f"--write_bw_log={prefix}", "--log_avg_msec=1000", "--per_job_logs=1"]
    cmd += job_args(job, chunks_dir, runtime_s)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as err:
        raise FioError(f"fio {job} did not finish in {timeout_s:.0f} s") from err
    if proc.returncode != 0 or not out.is_file():
        tail = " / ".join(proc.stderr.strip().splitlines()[-3:])
        raise FioError(f"fio {job} failed (exit {proc.returncode}): {tail}")
    text = out.read_text()
    report = json.loads(text[text.index("{") :])  # fio may print notes before the JSON
    bins = _bins(sorted(work.glob(f"{prefix.name}_bw.*.log"))) if log_bins else []
    return parse(report, job, bins, page_cache, cmd)


def parse(
    report: dict[str, Any], job: str, bins: list[float], page_cache: str, command: list[str]
) -> FioResult:
    """A :class:`FioResult` from fio's JSON report (``group_reporting``: one entry).

    Raises:
        FioError: The report has no job or a job reported an error.
    """
    jobs = report.get("jobs") or []
    if not jobs:
        raise FioError(f"fio {job}: no job in the report")
    entry = jobs[0]
    if entry.get("error"):
        raise FioError(f"fio {job}: error {entry['error']}")
    read = entry["read"]
    pct = read.get("clat_ns", {}).get("percentile", {})
    seconds = read.get("runtime", 0) / 1000
    return FioResult(
        job=job,
        bytes=int(read["io_bytes"]),
        seconds=seconds,
        mb_s=read["bw_bytes"] / 1e6,
        iops=float(read["iops"]),
        lat_p50_ms=pct.get("50.000000", 0) / 1e6,
        lat_p99_ms=pct.get("99.000000", 0) / 1e6,
        bins_mb_s=bins,
        page_cache=page_cache,
        command=command,
    )


def _bins(logs: list[Path]) -> list[float]:
    """MB/s of each 1 s interval, summed over the workers' ``*_bw.N.log`` files.

    Each line is ``msec, KiB/s, direction, block size, offset``; with
    ``log_avg_msec=1000`` fio writes one line per worker per second.
    """
    total: defaultdict[int, float] = defaultdict(float)
    for log in logs:
        for line in log.read_text().splitlines():
            fields = [f.strip() for f in line.split(",")]
            if len(fields) < 2 or not fields[0].isdigit():
                continue
            second = max(0, round(int(fields[0]) / 1000) - 1)
            total[second] += int(fields[1]) * 1024 / 1e6
    return [round(total[i], 3) for i in range(max(total) + 1)] if total else []
