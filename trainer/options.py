"""What a training run is asked to do (:class:`FitOptions`), and the checks of it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from trainer.hints import HintTarget
from trainer.location import StorageOptions, is_url

DEFAULT_OUT = Path("strata-train-out")
"""Output directory when ``--out`` is not given."""


class FitError(Exception):
    """Training cannot start or cannot continue; the message is one line."""


@dataclass(frozen=True)
class FitOptions:
    """Options of one training run.

    Attributes:
        data: Zarr/MDIO store to read (read-only): a local directory (a
            :class:`~pathlib.Path`) or an fsspec URL string (``s3://bucket/f3.mdio``).
        out: Output directory for ``metrics.jsonl``, ``summary.json`` and
            ``checkpoint.pt``; created if missing; must not be inside ``data``.
        steps: Total optimiser steps of the run (the schedule's length, >= 1).
        preset: Model preset name (see :mod:`trainer.presets`).
        batch_size: Patches per step and rank; ``None`` for the preset's default.
        workers: DataLoader worker processes per rank; 0 reads in the training process.
        seed: Seed (>= 0) of positions, model init, masks and everything else.
        log_every: Write a metrics line every this many steps (and at the last).
        epoch_size: Patch positions per epoch, over all ranks.
        lr: Peak learning rate; ``None`` for the preset's.
        threads: Torch intra-op threads; ``None`` for :func:`default_threads`.
        device: ``"auto"`` (CUDA when available), ``"cpu"`` or ``"cuda"``.
        mp_context: Worker start method, ``"spawn"`` or ``"forkserver"``.
        checkpoint: Write ``out/checkpoint.pt`` (every ``checkpoint_every`` steps
            and at the end).
        checkpoint_every: Steps between checkpoints; 0 for the end only.
        resume: Continue from ``out/checkpoint.pt``.
        stop_at: Stop after this step (checkpoint written), as if pre-empted;
            ``None`` runs to ``steps``.
        chunk_aligned: Place patches so each reads as few chunks as possible.
        min_live_fraction: Reject patches with fewer live traces than this.
        clip: Clip normalised amplitudes at this many standard deviations.
        scale: Multiply clipped values by this (``1 / clip`` maps to [-1, 1]).
        clip_grad: Global gradient-norm limit; 0 disables clipping.
        amp: bf16 autocast; ``None`` turns it on exactly when running on CUDA.
        hints: where rank 0 posts each upcoming epoch's read order (opt-in); ``None``
            leaves the run exactly as without hints.
        storage_options: fsspec options of a URL ``data`` (see :mod:`trainer.volume`);
            never written to the summary or checkpoints.
    """

    data: str | Path
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
    checkpoint_every: int = 100
    resume: bool = False
    stop_at: int | None = None
    chunk_aligned: bool = False
    min_live_fraction: float = 0.5
    clip: float = 3.0
    scale: float = 1.0
    clip_grad: float = 1.0
    amp: bool | None = None
    hints: HintTarget | None = None
    storage_options: StorageOptions = field(default_factory=dict, repr=False)


def check_out_dir(data: str | Path, out: Path) -> None:
    """Refuse an output directory inside (or equal to) the data path.

    Args:
        data: The data store (a URL is never a local directory ``out`` could be in).
        out: The proposed output directory.

    Raises:
        FitError: If ``out`` resolves to ``data`` or to a path below it, or is an
            existing file.
    """
    o = Path(out).resolve()
    if not is_url(data):
        d = Path(data).resolve()
        if o == d or o.is_relative_to(d):
            raise FitError(f"--out {out} is inside the data path {data}, which is read-only")
    if o.exists() and not o.is_dir():
        raise FitError(f"--out {out} exists and is not a directory")


def validate(opts: FitOptions, batch_size: int) -> None:
    """Refuse options out of range, naming the flag.

    Args:
        opts: The options.
        batch_size: Patches per step and rank (the preset's when ``--batch-size`` is unset).

    Raises:
        FitError: The first option out of range.
    """
    checks = [
        (opts.steps >= 1, f"--steps must be >= 1, got {opts.steps}"),
        (batch_size >= 1, f"--batch-size must be >= 1, got {batch_size}"),
        (opts.workers >= 0, f"--workers must be >= 0, got {opts.workers}"),
        (opts.seed >= 0, f"--seed must be >= 0, got {opts.seed}"),
        (opts.log_every >= 1, f"--log-every must be >= 1, got {opts.log_every}"),
        (opts.checkpoint_every >= 0, "--checkpoint-every must be >= 0"),
        (
            opts.mp_context in ("spawn", "forkserver"),
            f"worker start method must be spawn or forkserver, not {opts.mp_context}",
        ),
        (opts.threads is None or opts.threads >= 1, f"--threads must be >= 1, got {opts.threads}"),
        (
            opts.stop_at is None or 1 <= opts.stop_at <= opts.steps,
            f"--stop-at must be in [1, --steps {opts.steps}], got {opts.stop_at}",
        ),
        (
            0.0 <= opts.min_live_fraction <= 1.0,
            f"--min-live must be in [0, 1], got {opts.min_live_fraction}",
        ),
        (opts.clip > 0, f"--clip must be > 0, got {opts.clip}"),
        (opts.scale > 0, f"--scale must be > 0, got {opts.scale}"),
        (opts.clip_grad >= 0, f"--clip-grad must be >= 0, got {opts.clip_grad}"),
        (opts.lr is None or opts.lr > 0, f"--lr must be > 0, got {opts.lr}"),
    ]
    for ok, message in checks:
        if not ok:
            raise FitError(message)
