"""Measurements shared by every scenario: first byte, CPU time, trainer, link counters.

Definitions used in the results (all times in seconds, rates in MB/s = 10^6 B/s):

* **time to first byte**: ``open()`` plus the first 4 KiB ``read()`` of one file on the
  file system under test, right after it was mounted (cold) or after the page cache
  was dropped (warm);
* **trainer**: ``strata-train fit`` for N steps; its ``time_to_first_batch_s`` (from
  creating the DataLoader to the first batch, so it includes starting the worker
  processes), ``samples_per_s`` and ``data_wait_fraction`` (both over steps 2..N);
* **1 s bins**: bytes (or samples) counted in consecutive one-second intervals;
* **time to steady state**: see :func:`steady_state`;
* **link utilisation**: bytes that crossed the link towards the reader divided by
  (link capacity × elapsed time).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from trainer.command import fit_args

FIRST_BYTES = 4096
"""Bytes read for the time to first byte."""


def time_to_first_byte(path: Path, nbytes: int = FIRST_BYTES) -> float:
    """Seconds to ``open`` ``path`` and ``read`` its first ``nbytes``.

    Raises:
        OSError: The file cannot be opened or read, or is empty.
    """
    started = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    try:
        data = os.read(fd, nbytes)
    finally:
        os.close(fd)
    if not data:
        raise OSError(f"{path} is empty")
    return time.perf_counter() - started


def tree_cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds used so far by ``pid`` and all its descendants.

    Read from ``/proc/<pid>/stat`` (fields 14 and 15, in clock ticks); processes that
    exit in between are skipped. 0.0 for ``None``.
    """
    if pid is None:
        return 0.0
    children: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        child, parent = int(entry.name), int(fields[1])
        children.setdefault(parent, []).append(child)
        ticks[child] = int(fields[11]) + int(fields[12])
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        total += ticks.get(current, 0)
        todo += children.get(current, [])
    return total / os.sysconf("SC_CLK_TCK")


def read_pass(chunks_dir: Path, workers: int = 4, block: int = 1 << 20) -> int:
    """Read every file under ``chunks_dir/<k>`` sequentially, one thread per ``k``.

    The stand-in for fio's ``seq_1m`` job (same split, same 1 MiB reads) where fio is
    not installed. Returns the bytes read.
    """
    groups = [
        [p for p in sorted((chunks_dir / str(k)).rglob("*")) if p.is_file()] for k in range(workers)
    ]
    return read_groups(groups, block)


def read_groups(groups: list[list[Path]], block: int = 1 << 20) -> int:
    """Reads each group's files whole, in order, ``block`` bytes a read, one thread per
    group; returns the bytes read."""
    totals = [0] * len(groups)

    def reader(k: int) -> None:
        for path in groups[k]:
            fd = os.open(path, os.O_RDONLY)
            try:
                while data := os.read(fd, block):
                    totals[k] += len(data)
            finally:
                os.close(fd)

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(len(groups))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(totals)


class _Counters(Protocol):
    def stats(self) -> Any: ...


@dataclass
class LinkSampler:
    """Samples a link's byte counters every ``interval`` seconds on a thread.

    Args:
        link: Anything with ``stats()`` returning ``down_bytes`` and ``up_bytes``
            (a :class:`bench.wan.WanProxy`).
        interval: Seconds between samples.
    """

    link: _Counters
    interval: float = 0.1
    _times: list[float] = field(default_factory=list)
    _down: list[int] = field(default_factory=list)
    _up: list[int] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None

    def __enter__(self) -> LinkSampler:
        self._sample()
        self._thread = threading.Thread(target=self._run, name="link-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        self._sample()

    def _sample(self) -> float:
        with self._lock:
            stats = self.link.stats()
            now = time.monotonic()
            self._times.append(now)
            self._down.append(stats.down_bytes)
            self._up.append(stats.up_bytes)
            return now

    def mark(self) -> float:
        """Sample now and return the time: a phase boundary that sees every byte before it."""
        return self._sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def _at(self, series: list[int], t: float) -> int:
        i = bisect_right(self._times, t) - 1
        return series[max(0, i)]

    def down_bytes(self, t0: float, t1: float) -> int:
        """Bytes that crossed the link towards the reader between monotonic ``t0`` and ``t1``."""
        return self._at(self._down, t1) - self._at(self._down, t0)

    def up_bytes(self, t0: float, t1: float) -> int:
        """Bytes that crossed the link towards the server between ``t0`` and ``t1``."""
        return self._at(self._up, t1) - self._at(self._up, t0)

    def bins_mb_s(self, t0: float, t1: float, width: float = 1.0) -> list[float]:
        """Link throughput towards the reader in consecutive ``width``-second bins, MB/s."""
        bins = []
        t = t0
        while t < t1 - 1e-9:
            end = min(t + width, t1)
            bins.append(round(self.down_bytes(t, end) / (end - t) / 1e6, 3))
            t = end
        return bins


def link_utilisation(nbytes: int, seconds: float, rate_bps: float) -> float:
    """``nbytes`` over (capacity × ``seconds``); 0 when nothing was measured."""
    if seconds <= 0 or rate_bps <= 0 or rate_bps == float("inf"):
        return 0.0
    return nbytes / (rate_bps / 8 * seconds)


def steady_state(bins: list[float], tolerance: float = 0.2) -> tuple[float, float]:
    """When a throughput curve settles, and at what level.

    The level is the median of the second half of the bins (the last bin is dropped
    when there are more than three: it is usually a partial second). The time to steady
    state is the start of the first bin from which every 3-bin moving average stays
    within ``tolerance`` of that level.

    Returns:
        ``(seconds to steady state, steady level)``; ``(0.0, 0.0)`` for no bins.
    """
    values = bins[:-1] if len(bins) > 3 else list(bins)
    if not values:
        return 0.0, 0.0
    level = statistics.median(values[len(values) // 2 :])
    if level <= 0:
        return float(len(values)), 0.0
    window = min(3, len(values))
    averages = [statistics.fmean(values[i : i + window]) for i in range(len(values) - window + 1)]
    start = len(averages)
    for i in range(len(averages) - 1, -1, -1):
        if abs(averages[i] - level) > tolerance * level:
            break
        start = i
    return float(start), level


@dataclass(frozen=True)
class TrainerRun:
    """What ``strata-train fit`` reported.

    Attributes:
        time_to_first_batch_s: Trainer's own time to first batch.
        samples_per_s: Steady throughput (steps 2..N).
        data_wait_fraction: Share of step time spent waiting for data (steps 2..N).
        steps: Steps run.
        wall_s: Wall time of the whole command (start-up included).
        bins_samples_s: Samples of each 1 s interval since the DataLoader started.
        loss_first: First step's loss.
        loss_last: Last step's loss.
    """

    time_to_first_batch_s: float
    samples_per_s: float
    data_wait_fraction: float
    steps: int
    wall_s: float
    bins_samples_s: list[float]
    loss_first: float
    loss_last: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return dict(self.__dict__)


class TrainerError(RuntimeError):
    """The trainer failed; the message has the end of its output."""


def run_trainer(
    data: Path | str,
    out: Path,
    steps: int,
    workers: int = 2,
    batch_size: int = 8,
    seed: int = 0,
    timeout_s: float = 1800.0,
    extra: tuple[str, ...] = (),
    ranks: int = 1,
    env: dict[str, str] | None = None,
) -> TrainerRun:
    """Train for ``steps`` steps on ``data``; parse ``summary.json`` and ``metrics.jsonl``.

    Args:
        extra: More ``fit`` flags (e.g. ``("--hints", ADMIN_URL)``).
        ranks: Processes; above 1 the trainer runs under ``torchrun --standalone``.
        env: Variables added to this process's environment for the trainer (e.g. an
            object store's endpoint and credentials when ``data`` is an ``s3://`` URL).

    Raises:
        TrainerError: The trainer failed or timed out.
    """
    cmd = [sys.executable, "-m"]
    if ranks > 1:
        cmd += ["torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks), "-m"]
    cmd += fit_args(
        data,
        out,
        steps,
        batch_size=batch_size,
        workers=workers,
        seed=seed,
        log_every=1,
        checkpoint_every=0,
    )
    cmd += extra
    started = time.monotonic()
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=None if env is None else {**os.environ, **env},
        )
    except subprocess.TimeoutExpired as err:
        raise TrainerError(f"trainer did not finish in {timeout_s:.0f} s") from err
    wall = time.monotonic() - started
    if proc.returncode != 0:
        tail = " / ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        raise TrainerError(f"trainer failed (exit {proc.returncode}): {tail}")
    summary = json.loads((out / "summary.json").read_text())
    bins: list[float] = []
    first = float(summary["time_to_first_batch_s"])
    for line in (out / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        second = int(record["elapsed_s"])
        while len(bins) <= second:
            bins.append(0.0)
        bins[second] += float(summary["batch_size"]) * float(summary["world_size"])
    return TrainerRun(
        time_to_first_batch_s=first,
        samples_per_s=float(summary["samples_per_s"]),
        data_wait_fraction=float(summary["data_wait_fraction"]),
        steps=int(summary["steps"]),
        wall_s=wall,
        bins_samples_s=bins,
        loss_first=float(summary["loss_first"]),
        loss_last=float(summary["loss_last"]),
    )
