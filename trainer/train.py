"""The training loop (``strata-train fit``) and its measurements.

One run: inspect the store, estimate normalisation statistics, draw one epoch
of seeded patch positions, then train the masked autoencoder for ``steps``
optimiser steps, cycling epochs (same positions, a new seeded order each epoch).

Measured per step, with ``time.perf_counter``:

* **data wait**: time blocked in ``next(loader_iterator)``, i.e. waiting for the
  next batch (the cost of the storage path; near 0 when the loader keeps up);
* **step time**: data wait plus forward, backward and optimiser step.

``data_wait_fraction`` is data wait / step time. Step 1's wait includes starting
the DataLoader workers and the first reads; it is reported separately as
``time_to_first_batch_s`` and excluded from the steady-state ``samples_per_s``
and ``data_wait_fraction`` of the summary (``*_overall`` include it).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import torch
from torch.utils.data import DataLoader, RandomSampler

from trainer.dataset import (
    DataError,
    PatchDataset,
    VolumeInfo,
    check_fits,
    estimate_stats,
    inspect_volume,
    read_live_mask,
    sample_positions,
    worker_init,
)
from trainer.model import MaskedAutoencoder3D
from trainer.presets import MAEConfig, get_preset

DEFAULT_OUT = Path("strata-train-out")


class FitError(Exception):
    """Training cannot start or cannot continue; the message is one line."""


@dataclass(frozen=True)
class FitOptions:
    """Options of one training run.

    Attributes:
        data: Zarr/MDIO store to read (read-only).
        out: Output directory for ``metrics.jsonl``, ``summary.json`` and
            ``checkpoint.pt``; created if missing; must not be inside ``data``.
        steps: Number of optimiser steps (>= 1).
        preset: Model preset name (see :mod:`trainer.presets`).
        batch_size: Patches per step; ``None`` for the preset's default.
        workers: DataLoader worker processes; 0 reads in the training process.
        seed: Seed for positions, statistics sample, model init, masks and order.
        log_every: Write a metrics line every this many steps (and at the last).
        epoch_size: Patch positions per epoch (>= batch size).
        lr: Peak learning rate; ``None`` for the preset's.
        threads: Torch intra-op threads; ``None`` for :func:`default_threads`.
        device: ``"auto"`` (CUDA when available), ``"cpu"`` or ``"cuda"``.
        mp_context: Worker start method, ``"spawn"`` or ``"forkserver"``.
        checkpoint: Save the final model to ``out/checkpoint.pt``.
    """

    data: Path
    out: Path = DEFAULT_OUT
    steps: int = 300
    preset: str = "tiny"
    batch_size: int | None = None
    workers: int = 2
    seed: int = 0
    log_every: int = 1
    epoch_size: int = 1024
    lr: float | None = None
    threads: int | None = None
    device: str = "auto"
    mp_context: str = "spawn"
    checkpoint: bool = True


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


def available_cpus() -> int:
    """Number of CPU cores this process may run on (affinity-aware).

    Returns:
        At least 1.
    """
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def default_threads(workers: int, cpus: int | None = None) -> int:
    """Torch intra-op threads for the training process.

    DataLoader workers read and decode chunks on cores of their own, so the
    training step gets the rest, but never less than half of the cores:
    ``max(1, cpus - workers, cpus // 2)``. On 2 cores with 2 workers that is 1,
    which measured as fast as 2 and avoids OpenMP oversubscription stalls.

    Args:
        workers: DataLoader worker processes.
        cpus: Cores available; ``None`` for :func:`available_cpus`.

    Returns:
        At least 1.
    """
    n = available_cpus() if cpus is None else cpus
    return max(1, n - workers, n // 2)


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    """Learning rate for a 1-based step: linear warm-up, then cosine decay.

    Args:
        step: Step number, 1-based.
        total: Total number of steps.
        peak: Peak learning rate.
        warmup: Warm-up steps (linear from ``peak / warmup`` to ``peak``).

    Returns:
        The learning rate; decays to 10 % of ``peak`` at ``step == total``.
    """
    if warmup > 0 and step <= warmup:
        return peak * step / warmup
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def check_out_dir(data: Path, out: Path) -> None:
    """Refuse an output directory inside (or equal to) the data path.

    Args:
        data: The data store.
        out: The proposed output directory.

    Raises:
        FitError: If ``out`` resolves to ``data`` or to a path below it, or is an
            existing file.
    """
    d = data.resolve()
    o = out.resolve()
    if o == d or o.is_relative_to(d):
        raise FitError(f"--out {out} is inside the data path {data}, which is read-only")
    if o.exists() and not o.is_dir():
        raise FitError(f"--out {out} exists and is not a directory")


def _validate(opts: FitOptions, batch_size: int) -> None:
    if opts.steps < 1:
        raise FitError(f"--steps must be >= 1, got {opts.steps}")
    if batch_size < 1:
        raise FitError(f"--batch-size must be >= 1, got {batch_size}")
    if opts.workers < 0:
        raise FitError(f"--workers must be >= 0, got {opts.workers}")
    if opts.log_every < 1:
        raise FitError(f"--log-every must be >= 1, got {opts.log_every}")
    if opts.epoch_size < batch_size:
        raise FitError(f"--epoch-size {opts.epoch_size} is smaller than the batch {batch_size}")
    if opts.mp_context not in ("spawn", "forkserver"):
        raise FitError(f"worker start method must be spawn or forkserver, not {opts.mp_context}")
    if opts.threads is not None and opts.threads < 1:
        raise FitError(f"--threads must be >= 1, got {opts.threads}")


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise FitError("--device cuda requested but no CUDA device is available")
    if name not in ("cpu", "cuda"):
        raise FitError(f"--device must be auto, cpu or cuda, not {name!r}")
    return torch.device(name)


def build_dataset(opts: FitOptions, config: MAEConfig) -> tuple[VolumeInfo, PatchDataset]:
    """Inspect the store and build one epoch's patch dataset.

    Args:
        opts: Run options (data path, seed, epoch size).
        config: Model preset (patch shape).

    Returns:
        The volume description and the dataset.

    Raises:
        DataError: If the store cannot be used (see :mod:`trainer.dataset`).
    """
    info = inspect_volume(opts.data)
    check_fits(info, config.input_size)
    mask = read_live_mask(info)
    stats = estimate_stats(info, config.input_size, seed=opts.seed + 1)
    positions = sample_positions(info.shape, config.input_size, opts.epoch_size, opts.seed, mask)
    return info, PatchDataset(info, config.input_size, stats, positions)


def _write_json_line(fh: TextIO, record: dict[str, Any]) -> None:
    fh.write(json.dumps(record) + "\n")
    fh.flush()


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def fit(opts: FitOptions, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Train the masked autoencoder and write metrics, summary and checkpoint.

    Writes ``opts.out/metrics.jsonl`` (one JSON object per logged step: ``step``,
    ``epoch``, ``loss`` (mean over the steps since the previous line), ``lr``,
    ``samples_per_s``, ``data_wait_fraction``, ``data_wait_s``, ``step_time_s``,
    ``elapsed_s``), ``opts.out/summary.json`` (the returned dictionary) and,
    unless disabled, ``opts.out/checkpoint.pt``.

    Args:
        opts: Run options.
        echo: Receives the short human summary, line by line.

    Returns:
        The summary: ``steps``, ``batch_size``, ``samples``, ``elapsed_s`` (wall
        time of the loop, first batch included), ``samples_per_s`` and
        ``data_wait_fraction`` (steady state: steps after the first),
        ``samples_per_s_overall``, ``data_wait_fraction_overall``, ``loss_first``,
        ``loss_last``, ``loss_first10_mean``, ``loss_last10_mean``,
        ``time_to_first_batch_s``, ``data`` (the path) and run details.

    Raises:
        DataError: If the data path is unusable (missing, not a store, volume
            smaller than a patch, no live data).
        FitError: On invalid options, an output directory inside the data, or a
            non-finite loss.
    """
    try:
        config = get_preset(opts.preset)
    except ValueError as exc:
        raise FitError(str(exc)) from None
    batch_size = config.batch_size if opts.batch_size is None else opts.batch_size
    _validate(opts, batch_size)
    device = _device(opts.device)

    info, dataset = build_dataset(opts, config)
    check_out_dir(Path(opts.data), Path(opts.out))
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)

    threads = opts.threads or default_threads(opts.workers)
    torch.set_num_threads(threads)
    torch.manual_seed(opts.seed)
    model = MaskedAutoencoder3D(config).to(device)
    peak_lr = opts.lr if opts.lr is not None else config.lr
    warmup = min(config.warmup_steps, max(1, opts.steps // 10))
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=peak_lr, betas=(0.9, 0.95), weight_decay=config.weight_decay
    )

    order = torch.Generator()
    order.manual_seed(opts.seed)
    workers = opts.workers
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=RandomSampler(dataset, generator=order),
        drop_last=True,
        num_workers=workers,
        multiprocessing_context=opts.mp_context if workers > 0 else None,
        persistent_workers=workers > 0,
        worker_init_fn=worker_init if workers > 0 else None,
        pin_memory=device.type == "cuda",
    )

    losses: list[float] = []
    waits: list[float] = []
    step_times: list[float] = []
    window = _Window()
    epoch = 0
    time_to_first_batch = 0.0
    model.train()
    with (out / "metrics.jsonl").open("w") as metrics:
        t_start = time.perf_counter()
        iterator = iter(loader)
        for step in range(1, opts.steps + 1):
            t0 = t_start if step == 1 else time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                epoch += 1
                order.manual_seed(opts.seed + epoch)
                iterator = iter(loader)
                batch = next(iterator)
            t1 = time.perf_counter()
            if step == 1:
                time_to_first_batch = t1 - t_start

            lr = lr_at(step, opts.steps, peak_lr, warmup)
            for group in optimizer.param_groups:
                group["lr"] = lr
            x = batch.to(device, non_blocking=True)
            loss = model(x).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            loss_value = float(loss.detach())
            if device.type == "cuda":
                torch.cuda.synchronize()
            t2 = time.perf_counter()
            if not math.isfinite(loss_value):
                raise FitError(f"loss became non-finite ({loss_value}) at step {step}")

            losses.append(loss_value)
            waits.append(t1 - t0)
            step_times.append(t2 - t0)
            window.add(loss_value, t1 - t0, t2 - t0)
            if step % opts.log_every == 0 or step == opts.steps:
                _write_json_line(
                    metrics,
                    {
                        "step": step,
                        "epoch": epoch,
                        "loss": window.loss_sum / window.steps,
                        "lr": lr,
                        "samples_per_s": window.steps * batch_size / window.step_s,
                        "data_wait_fraction": window.wait_s / window.step_s,
                        "data_wait_s": window.wait_s,
                        "step_time_s": window.step_s / window.steps,
                        "elapsed_s": t2 - t_start,
                    },
                )
                window = _Window()
        elapsed = time.perf_counter() - t_start
    del iterator, loader  # stops persistent workers

    steady_steps = step_times[1:] or step_times
    steady_waits = waits[1:] or waits
    samples = opts.steps * batch_size
    head = losses[: min(10, len(losses))]
    tail = losses[-min(10, len(losses)) :]
    summary: dict[str, Any] = {
        "steps": opts.steps,
        "batch_size": batch_size,
        "samples": samples,
        "elapsed_s": elapsed,
        "samples_per_s": len(steady_steps) * batch_size / sum(steady_steps),
        "data_wait_fraction": sum(steady_waits) / sum(steady_steps),
        "samples_per_s_overall": samples / elapsed,
        "data_wait_fraction_overall": sum(waits) / sum(step_times),
        "data_wait_s": sum(waits),
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "loss_first10_mean": _mean(head),
        "loss_last10_mean": _mean(tail),
        "time_to_first_batch_s": time_to_first_batch,
        "data": str(opts.data),
        "volume": {
            "variable": info.variable,
            "trace_mask": info.mask_variable,
            "shape": list(info.shape),
            "chunks": list(info.chunks),
            "dtype": info.dtype,
            "mean": dataset.stats.mean,
            "std": dataset.stats.std,
            "clip_sigma": dataset.stats.clip,
        },
        "preset": asdict(config),
        "parameters": sum(p.numel() for p in model.parameters()),
        "epochs_started": epoch + 1,
        "epoch_size": opts.epoch_size,
        "workers": workers,
        "mp_context": opts.mp_context if workers > 0 else None,
        "threads": threads,
        "device": str(device),
        "seed": opts.seed,
        "lr": peak_lr,
        "warmup_steps": warmup,
    }
    if opts.checkpoint:
        torch.save(
            {
                "model": model.state_dict(),
                "preset": asdict(config),
                "stats": asdict(dataset.stats),
                "steps": opts.steps,
            },
            out / "checkpoint.pt",
        )
    text = json.dumps(summary, indent=2)
    (out / "summary.json").write_text(text + "\n")
    summary = json.loads(text)  # the caller sees exactly what the file holds

    echo(
        f"trained {opts.steps} steps x {batch_size} = {samples} patches of "
        f"{'x'.join(map(str, config.input_size))} in {elapsed:.1f} s "
        f"(first batch after {time_to_first_batch:.2f} s)"
    )
    echo(
        f"throughput {summary['samples_per_s']:.1f} samples/s, "
        f"data wait {100 * summary['data_wait_fraction']:.1f}% of step time "
        f"({workers} workers, {threads} threads, {device})"
    )
    echo(
        f"loss {summary['loss_first10_mean']:.3f} -> {summary['loss_last10_mean']:.3f} "
        f"(mean of first/last {len(tail)} steps)"
    )
    echo(f"wrote {out / 'summary.json'} and {out / 'metrics.jsonl'}")
    return summary


__all__ = [
    "DEFAULT_OUT",
    "DataError",
    "FitError",
    "FitOptions",
    "available_cpus",
    "build_dataset",
    "check_out_dir",
    "default_threads",
    "fit",
    "lr_at",
]
