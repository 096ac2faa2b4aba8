"""What a run reports: per-step measurements, ``metrics.jsonl``, ``summary.json``, rank files.

Measured per step, with ``time.perf_counter`` (see :mod:`trainer.train`): the data
wait (blocked in ``next(loader_iterator)``) and the step time (data wait plus
forward, backward and optimiser step). Step 1's wait includes starting the
DataLoader workers and the first reads; it is reported separately as
``time_to_first_batch_s`` and excluded from the steady-state ``samples_per_s``
and ``data_wait_fraction`` of the summary (``*_overall`` include it).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np


def write_json(path: Path, record: Any) -> None:
    """Write ``record`` as indented JSON, atomically (temporary file, then rename)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, path)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


@dataclass
class _Window:
    """Accumulates step measurements between two metrics lines."""

    steps: int = 0
    loss_sum: float = 0.0
    wait_s: float = 0.0
    step_s: float = 0.0

    def add(self, loss: float, wait_s: float, step_s: float) -> None:
        self.steps += 1
        self.loss_sum += loss
        self.wait_s += wait_s
        self.step_s += step_s


class MetricsLog:
    """``metrics.jsonl``: one line per logged step, averaged over the steps since the last.

    Each line holds ``step``, ``epoch``, ``loss`` (mean over the window), ``lr``,
    ``samples_per_s`` (all ranks), ``data_wait_fraction``, ``data_wait_s``,
    ``step_time_s`` (mean) and ``elapsed_s``. A resumed run keeps the lines up to its
    start step and appends.

    Args:
        path: The file; ``None`` records nothing (ranks other than 0).
        keep_through: Keep the existing lines up to this step (0: start afresh).
        global_batch: Samples per step over all ranks.
    """

    def __init__(self, path: Path | None, keep_through: int, global_batch: int) -> None:
        self._global_batch = global_batch
        self._window = _Window()
        self._fh: TextIO | None = None
        if path is None:
            return
        if keep_through <= 0 or not path.exists():
            self._fh = path.open("w")
            return
        kept = [
            line
            for line in path.read_text().splitlines()
            if line.strip() and json.loads(line).get("step", 0) <= keep_through
        ]
        path.write_text("".join(line + "\n" for line in kept))
        self._fh = path.open("a")

    def add(self, loss: float, wait_s: float, step_s: float) -> None:
        """Count one step in the current window."""
        self._window.add(loss, wait_s, step_s)

    def write(self, step: int, epoch: int, lr: float, elapsed_s: float) -> None:
        """Write the window's line (when this log writes at all) and start a new window."""
        w = self._window
        if self._fh is not None:
            record = {
                "step": step,
                "epoch": epoch,
                "loss": w.loss_sum / w.steps,
                "lr": lr,
                "samples_per_s": w.steps * self._global_batch / w.step_s,
                "data_wait_fraction": w.wait_s / w.step_s,
                "data_wait_s": w.wait_s,
                "step_time_s": w.step_s / w.steps,
                "elapsed_s": elapsed_s,
            }
            self._fh.write(json.dumps(record) + "\n")
            self._fh.flush()
        self._window = _Window()

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None


@dataclass
class Measurements:
    """Every step's loss, data wait and step time, and a digest of the corners read.

    Attributes:
        losses: Loss of each step (averaged over ranks).
        waits: Data wait of each step, seconds.
        step_times: Step time of each step, seconds.
        read_count: Patches read by this rank.
        time_to_first_batch_s: From creating the loader iterator to the first batch.
    """

    losses: list[float] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)
    read_count: int = 0
    time_to_first_batch_s: float = 0.0
    _reads: Any = field(default_factory=hashlib.sha256)

    def add_reads(self, corners: np.ndarray[Any, Any]) -> None:
        """Fold a batch's corners ``(B, 3)`` into the read digest."""
        self._reads.update(corners.astype("<i8").tobytes())
        self.read_count += len(corners)

    def add_step(self, loss: float, wait_s: float, step_s: float) -> None:
        """Record one step."""
        self.losses.append(loss)
        self.waits.append(wait_s)
        self.step_times.append(step_s)

    @property
    def read_digest(self) -> str:
        """SHA-256 of every corner read, in order (int64 little-endian)."""
        digest: str = self._reads.hexdigest()
        return digest

    def totals(self, steps_run: int, global_batch: int, elapsed: float) -> dict[str, Any]:
        """The summary's measured fields (see :func:`trainer.train.fit`)."""
        steady_steps = self.step_times[1:] or self.step_times
        steady_waits = self.waits[1:] or self.waits
        samples = steps_run * global_batch
        head = self.losses[: min(10, len(self.losses))]
        tail = self.losses[-min(10, len(self.losses)) :]
        return {
            "samples": samples,
            "elapsed_s": elapsed,
            "samples_per_s": len(steady_steps) * global_batch / sum(steady_steps),
            "data_wait_fraction": sum(steady_waits) / sum(steady_steps),
            "samples_per_s_overall": samples / elapsed,
            "data_wait_fraction_overall": sum(self.waits) / sum(self.step_times),
            "data_wait_s": sum(self.waits),
            "loss_first": self.losses[0],
            "loss_last": self.losses[-1],
            "loss_first10_mean": _mean(head),
            "loss_last10_mean": _mean(tail),
            "time_to_first_batch_s": self.time_to_first_batch_s,
        }


def summary_lines(summary: dict[str, Any], patch: str, threads: int, amp: bool) -> list[str]:
    """The short human summary of a run, line by line.

    Args:
        summary: The run's summary (``summary.json``).
        patch: The patch shape, e.g. ``"16x16x32"``.
        threads: Torch intra-op threads used.
        amp: Whether bf16 autocast was on.
    """
    tail = min(10, summary["steps"])
    world = summary["world_size"]
    ranks = f" on {world} ranks" if world > 1 else ""
    return [
        f"trained steps {summary['start_step'] + 1}-{summary['end_step']} of "
        f"{summary['total_steps']} x {summary['batch_size']}{ranks} = {summary['samples']} "
        f"patches of {patch} in {summary['elapsed_s']:.1f} s "
        f"(first batch after {summary['time_to_first_batch_s']:.2f} s)",
        f"throughput {summary['samples_per_s']:.1f} samples/s, "
        f"data wait {100 * summary['data_wait_fraction']:.1f}% of step time "
        f"({summary['workers']} workers, {threads} threads, {summary['device']}"
        f"{', bf16 autocast' if amp else ''})",
        f"loss {summary['loss_first10_mean']:.3f} -> {summary['loss_last10_mean']:.3f} "
        f"(mean of first/last {tail} steps)",
    ]
