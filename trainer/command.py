"""The ``strata-train fit`` command line, for programs that run the trainer as a child.

The benchmarks (:mod:`bench.measure`) and the demo (:mod:`demo.cli`) both start
``python -m trainer fit``; they build its arguments here, next to the command they name
(:func:`trainer.cli.fit`), so a renamed flag breaks one place. Importing this module
imports nothing heavy (no torch, no zarr).
"""

from __future__ import annotations

from pathlib import Path


def fit_args(
    data: Path | str,
    out: Path,
    steps: int,
    *,
    batch_size: int,
    workers: int,
    preset: str = "tiny",
    seed: int | None = None,
    log_every: int | None = None,
    checkpoint_every: int | None = None,
) -> list[str]:
    """The arguments after ``python -m``: ``["trainer", "fit", "--data", DATA, ...]``.

    Args:
        data: The MDIO volume to train on (a local path, one in a Strata mount, or an
            object-store URL such as ``s3://bucket/f3.mdio``).
        out: Output directory (``summary.json``, ``metrics.jsonl``, checkpoints).
        steps: Optimiser steps.
        batch_size: Samples per step per process.
        workers: DataLoader worker processes.
        preset: Model size (a key of :data:`trainer.presets.PRESETS`).
        seed: ``--seed``; ``None`` leaves the trainer's default.
        log_every: ``--log-every`` (steps between metric records); ``None``: default.
        checkpoint_every: ``--checkpoint-every`` (0: never); ``None``: default.
    """
    args = ["trainer", "fit", "--data", str(data), "--steps", str(steps), "--preset", preset]
    args += ["--batch-size", str(batch_size), "--workers", str(workers)]
    for flag, value in (
        ("--seed", seed),
        ("--log-every", log_every),
        ("--checkpoint-every", checkpoint_every),
    ):
        if value is not None:
            args += [flag, str(value)]
    return [*args, "--out", str(out)]
