"""The training loop (``strata-train fit``): AdamW, warm-up + cosine, checkpoints, DDP.

One run: inspect the store, take the normalisation statistics, build the epoch
plan (:class:`trainer.plan.EpochPlan`: a fixed, seeded list of patch corners
per epoch, split into one shard per rank), then train the masked autoencoder
for ``steps`` optimiser steps, epoch after epoch.

Optimisation: AdamW (Loshchilov & Hutter 2019) with MAE's betas (0.9, 0.95) and
no weight decay on biases, norms and the mask token; the learning rate warms up
linearly and then follows a cosine decay to :data:`LR_FLOOR` of its peak
(Loshchilov & Hutter 2017, "SGDR: Stochastic Gradient Descent with Warm
Restarts", without restarts); gradients are clipped to a global norm. On CUDA
the forward pass runs under bf16 autocast (the loss stays float32).

Checkpoints (``OUT/checkpoint.pt``, written atomically, never under the data
path) hold the model, optimiser, scheduler, step and every rank's RNG states;
``--resume`` continues from one exactly: on CPU, N steps straight and N/2 +
resume + N/2 give bit-identical parameters.

Distributed data parallel: launched with ``torchrun`` (``RANK``/``WORLD_SIZE``/
``LOCAL_RANK`` in the environment), each rank reads its own shard of every
epoch and gradients are averaged with DDP (gloo on CPU, nccl on CUDA). Rank 0
writes the metrics, summary and checkpoints; every rank writes
``rank-<r>.json`` (what it read, a digest of its final parameters).

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

import hashlib
import json
import math
import os
import random
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from trainer.dataset import PatchDataset, worker_init
from trainer.hints import HintPoster, HintTarget, default_stream
from trainer.model import MaskedAutoencoder3D
from trainer.plan import STREAM_MASK, EpochPlan, EpochSampler, build_plan, derive_seed
from trainer.presets import MAEConfig, get_preset
from trainer.readorder import epoch_read_order
from trainer.stats import VolumeStats, volume_stats
from trainer.volume import DataError, VolumeInfo, check_fits, inspect_volume

DEFAULT_OUT = Path("strata-train-out")
CHECKPOINT_NAME = "checkpoint.pt"
CHECKPOINT_FORMAT = 1
LR_FLOOR = 0.1
"""The cosine schedule ends at this fraction of the peak learning rate."""
_STREAM_LOADER = 5


class FitError(Exception):
    """Training cannot start or cannot continue; the message is one line."""


@dataclass(frozen=True)
class FitOptions:
    """Options of one training run.

    Attributes:
        data: Zarr/MDIO store to read (read-only).
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


@dataclass(frozen=True)
class DistContext:
    """This process's place in a (possibly single-process) distributed run.

    Attributes:
        rank: Global rank.
        world_size: Number of processes.
        local_rank: Rank on this machine (selects the CUDA device).
        local_world_size: Processes on this machine (shares its cores).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1

    @property
    def enabled(self) -> bool:
        """Whether more than one process takes part."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0 (writes metrics, summary, checkpoints)."""
        return self.rank == 0


def dist_context_from_env(env: Mapping[str, str] | None = None) -> DistContext:
    """Read the rank layout ``torchrun`` puts in the environment.

    Args:
        env: Environment mapping; ``None`` for ``os.environ``.

    Returns:
        The context; a single process when ``WORLD_SIZE`` is unset.

    Raises:
        FitError: If the variables are inconsistent.
    """
    e = os.environ if env is None else env
    try:
        world = int(e.get("WORLD_SIZE", "1"))
        rank = int(e.get("RANK", "0"))
        local_rank = int(e.get("LOCAL_RANK", str(rank)))
        local_world = int(e.get("LOCAL_WORLD_SIZE", str(world)))
    except ValueError as exc:
        raise FitError(f"bad torchrun environment: {exc}") from None
    if not (world >= 1 and 0 <= rank < world and 0 <= local_rank < local_world <= world):
        raise FitError(
            f"bad torchrun environment: RANK={rank} WORLD_SIZE={world} "
            f"LOCAL_RANK={local_rank} LOCAL_WORLD_SIZE={local_world}"
        )
    return DistContext(rank, world, local_rank, local_world)


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


def lr_at(step: int, total: int, peak: float, warmup: int, floor: float = LR_FLOOR) -> float:
    """Learning rate for a 1-based step: linear warm-up, then cosine decay.

    The decay is SGDR's cosine annealing (Loshchilov & Hutter 2017) without
    restarts, from ``peak`` to ``floor * peak``.

    Args:
        step: Step number, 1-based.
        total: Total number of steps.
        peak: Peak learning rate.
        warmup: Warm-up steps (linear from ``peak / warmup`` to ``peak``).
        floor: Final learning rate as a fraction of ``peak``.

    Returns:
        The learning rate; ``floor * peak`` at ``step == total``.
    """
    if warmup > 0 and step <= warmup:
        return peak * step / warmup
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    return peak * (floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress)))


class WarmupCosine:
    """``LambdaLR`` multiplier for :func:`lr_at` (picklable, so it checkpoints).

    ``LambdaLR`` calls it with the number of scheduler steps taken so far,
    which is the 1-based optimiser step minus one.

    Args:
        total: Total optimiser steps.
        warmup: Warm-up steps.
        floor: Final fraction of the peak.
    """

    def __init__(self, total: int, warmup: int, floor: float = LR_FLOOR) -> None:
        self.total = total
        self.warmup = warmup
        self.floor = floor

    def __call__(self, index: int) -> float:
        """Multiplier of the peak learning rate for step ``index + 1``."""
        return lr_at(index + 1, self.total, 1.0, self.warmup, self.floor)


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


def select_device(name: str, ctx: DistContext = DistContext()) -> torch.device:
    """The device to train on.

    Args:
        name: ``"auto"`` (CUDA when available), ``"cpu"`` or ``"cuda"``.
        ctx: Distributed context; on CUDA, rank ``local_rank`` gets GPU ``local_rank``.

    Returns:
        The device.

    Raises:
        FitError: For an unknown name, or ``"cuda"`` without a CUDA device.
    """
    if name not in ("auto", "cpu", "cuda"):
        raise FitError(f"--device must be auto, cpu or cuda, not {name!r}")
    if name == "cuda" and not torch.cuda.is_available():
        raise FitError("--device cuda requested but no CUDA device is available")
    if name == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    if ctx.local_rank >= torch.cuda.device_count():
        raise FitError(
            f"local rank {ctx.local_rank} has no GPU ({torch.cuda.device_count()} visible)"
        )
    return torch.device("cuda", ctx.local_rank)


def autocast(device: torch.device, enabled: bool) -> AbstractContextManager[Any]:
    """bf16 autocast on ``device`` when ``enabled`` (a no-op context otherwise).

    Args:
        device: The training device.
        enabled: Whether to autocast.

    Returns:
        A ``torch.autocast`` context.
    """
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=enabled)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW parameter groups: decay on matrices only.

    As in MAE, biases, LayerNorm parameters and the mask token (every
    parameter with fewer than two dimensions, plus ``mask_token``) get no
    weight decay.

    Args:
        model: The model.
        weight_decay: Decay of the decayed group.

    Returns:
        Two groups for ``torch.optim.AdamW``.
    """
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or name.endswith("mask_token") else decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def params_digest(model: nn.Module) -> str:
    """SHA-256 over the model's state dict (names, dtypes, shapes, bytes).

    Args:
        model: A model (unwrapped, not the DDP wrapper).

    Returns:
        Hex digest; equal digests mean bit-identical parameters and buffers.
    """
    h = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _rng_state(mask_gen: torch.Generator, device: torch.device) -> dict[str, Any]:
    np_state = np.random.get_state(legacy=False)
    assert isinstance(np_state, dict)
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "key": [int(v) for v in np_state["state"]["key"]],
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "python": random.getstate(),
        "mask": mask_gen.get_state(),
    }


def _set_rng_state(state: dict[str, Any], mask_gen: torch.Generator, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and state.get("cuda") is not None:
        torch.cuda.set_rng_state(state["cuda"], device)
    n = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": n["bit_generator"],
            "state": {"key": np.asarray(n["key"], dtype=np.uint32), "pos": n["pos"]},
            "has_gauss": n["has_gauss"],
            "gauss": n["gauss"],
        }
    )
    random.setstate(state["python"])
    mask_gen.set_state(state["mask"])


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load a checkpoint written by :func:`fit` (tensors on the CPU).

    Uses ``torch.load(weights_only=True)``: a checkpoint holds only tensors and
    plain values, never pickled code.

    Args:
        path: The ``checkpoint.pt`` file.

    Returns:
        The checkpoint dictionary.

    Raises:
        FitError: If the file is missing or is not a trainer checkpoint.
    """
    if not path.is_file():
        raise FitError(f"no checkpoint at {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for corrupt or foreign files
        raise FitError(f"cannot read checkpoint {path}: {type(exc).__name__}") from exc
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise FitError(f"{path} is not a strata-train checkpoint (format {CHECKPOINT_FORMAT})")
    return ckpt


def _plain(value: Any) -> Any:
    """Tuples to lists, recursively, so dictionaries compare like their JSON."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _check_resumable(ckpt: dict[str, Any], expected: dict[str, Any], path: Path) -> None:
    for key, want in expected.items():
        have = _plain(ckpt.get(key))
        if have != _plain(want):
            if isinstance(want, dict) and isinstance(have, dict):
                diff = next(k for k in sorted(set(want) | set(have)) if have.get(k) != want.get(k))
                raise FitError(
                    f"cannot resume from {path}: {key}.{diff} was {have.get(diff)!r}, "
                    f"this run has {want.get(diff)!r}"
                )
            raise FitError(f"cannot resume from {path}: {key} was {have!r}, this run has {want!r}")


def _atomic_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _write_json(path: Path, record: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, path)


def _write_json_line(fh: TextIO, record: dict[str, Any]) -> None:
    fh.write(json.dumps(record) + "\n")
    fh.flush()


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _open_metrics(path: Path, keep_through: int) -> TextIO:
    """Open ``metrics.jsonl`` for appending after ``keep_through`` (0: start afresh)."""
    if keep_through <= 0 or not path.exists():
        return path.open("w")
    kept = [
        line
        for line in path.read_text().splitlines()
        if line.strip() and json.loads(line).get("step", 0) <= keep_through
    ]
    path.write_text("".join(line + "\n" for line in kept))
    return path.open("a")


def build_dataset(
    opts: FitOptions, config: MAEConfig, batch_size: int, world_size: int = 1
) -> tuple[VolumeInfo, PatchDataset, EpochPlan]:
    """Inspect the store, take its statistics and build the run's epoch plan.

    Args:
        opts: Run options (data path, seed, epoch size, sampling options).
        config: Model preset (patch shape).
        batch_size: Patches per step and rank.
        world_size: Number of ranks.

    Returns:
        The volume description, the dataset and the plan.

    Raises:
        DataError: If the store cannot be used (see :mod:`trainer.volume`).
        FitError: If an epoch is smaller than one batch on every rank.
    """
    info = inspect_volume(opts.data)
    check_fits(info, config.input_size)
    stats = volume_stats(info, config.input_size, opts.seed, opts.clip, opts.scale)
    try:
        plan = build_plan(
            info,
            config.input_size,
            epoch_size=opts.epoch_size,
            batch_size=batch_size,
            seed=opts.seed,
            world_size=world_size,
            min_live_fraction=opts.min_live_fraction,
            chunk_aligned=opts.chunk_aligned,
        )
    except ValueError as exc:
        raise FitError(f"--epoch-size: {exc}") from None
    return info, PatchDataset(info, config.input_size, stats), plan


class _Trainer:
    """State of one run on one rank; :func:`fit` drives it."""

    def __init__(self, opts: FitOptions, ctx: DistContext, echo: Callable[[str], None]) -> None:
        self.opts = opts
        self.ctx = ctx
        self.echo = echo if ctx.is_main else (lambda _line: None)
        try:
            self.config = get_preset(opts.preset)
        except ValueError as exc:
            raise FitError(str(exc)) from None
        self.batch_size = self.config.batch_size if opts.batch_size is None else opts.batch_size
        _validate(opts, self.batch_size)
        self.device = select_device(opts.device, ctx)
        self.amp = self.device.type == "cuda" if opts.amp is None else opts.amp
        self.info, self.dataset, self.plan = build_dataset(
            opts, self.config, self.batch_size, ctx.world_size
        )
        self.out = Path(opts.out)
        check_out_dir(Path(opts.data), self.out)
        self.ckpt_path = self.out / CHECKPOINT_NAME
        self.peak_lr = opts.lr if opts.lr is not None else self.config.lr
        self.warmup = min(self.config.warmup_steps, max(1, opts.steps // 10))
        self.stop = opts.stop_at if opts.stop_at is not None else opts.steps

    def identity(self) -> dict[str, Any]:
        """What a checkpoint must match to be resumed by this run."""
        return {
            "preset": asdict(self.config),
            "plan": self.plan.spec.to_dict(),
            "schedule": {
                "total_steps": self.opts.steps,
                "peak_lr": self.peak_lr,
                "warmup_steps": self.warmup,
                "floor": LR_FLOOR,
                "weight_decay": self.config.weight_decay,
                "clip_grad": self.opts.clip_grad,
            },
        }


def fit(opts: FitOptions, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Train the masked autoencoder and write metrics, summary and checkpoints.

    Rank 0 writes ``opts.out/metrics.jsonl`` (one JSON object per logged step:
    ``step``, ``epoch``, ``loss`` (mean over the steps since the previous line,
    averaged over ranks), ``lr``, ``samples_per_s`` (all ranks),
    ``data_wait_fraction``, ``data_wait_s``, ``step_time_s``, ``elapsed_s``),
    ``opts.out/summary.json`` (the returned dictionary) and
    ``opts.out/checkpoint.pt``. In a distributed run every rank also writes
    ``opts.out/rank-<r>.json``.

    Args:
        opts: Run options.
        echo: Receives the short human summary, line by line (rank 0 only).

    Returns:
        The summary: ``steps`` (run by this invocation), ``start_step``,
        ``end_step``, ``total_steps``, ``batch_size`` (per rank), ``world_size``,
        ``samples``, ``elapsed_s`` (wall time of the loop, first batch included),
        ``samples_per_s`` and ``data_wait_fraction`` (steady state: steps after
        the first), ``samples_per_s_overall``, ``data_wait_fraction_overall``,
        ``loss_first``, ``loss_last``, ``loss_first10_mean``, ``loss_last10_mean``,
        ``time_to_first_batch_s``, ``data`` (the path) and run details.

    Raises:
        DataError: If the data path is unusable (missing, not a store, volume
            smaller than a patch, no live data).
        FitError: On invalid options, an output directory inside the data, a
            checkpoint that does not match the run, or a non-finite loss.
    """
    ctx = dist_context_from_env()
    trainer = _Trainer(opts, ctx, echo)
    if ctx.enabled:
        backend = "nccl" if trainer.device.type == "cuda" else "gloo"
        if trainer.device.type == "cuda":
            torch.cuda.set_device(trainer.device)
        dist.init_process_group(backend=backend)
    try:
        return _run(trainer)
    finally:
        if ctx.enabled and dist.is_initialized():
            dist.destroy_process_group()


def _run(tr: _Trainer) -> dict[str, Any]:
    opts, ctx, device, config = tr.opts, tr.ctx, tr.device, tr.config
    ckpt: dict[str, Any] | None = None
    if opts.resume:
        ckpt = load_checkpoint(tr.ckpt_path)
        _check_resumable(ckpt, tr.identity(), tr.ckpt_path)
        if ckpt["step"] >= tr.stop:
            raise FitError(
                f"checkpoint {tr.ckpt_path} is at step {ckpt['step']}: nothing to do up to "
                f"step {tr.stop}"
            )
        if len(ckpt["rng"]) != ctx.world_size:
            raise FitError(
                f"checkpoint has RNG states of {len(ckpt['rng'])} ranks, not {ctx.world_size}"
            )
        tr.dataset.stats = VolumeStats(**ckpt["stats"])  # normalise exactly as before
    start_step = int(ckpt["step"]) if ckpt is not None else 0
    tr.out.mkdir(parents=True, exist_ok=True)

    threads = opts.threads or default_threads(
        opts.workers, max(1, available_cpus() // ctx.local_world_size)
    )
    torch.set_num_threads(threads)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(opts.seed)
    model = MaskedAutoencoder3D(config).to(device)
    optimizer = torch.optim.AdamW(
        param_groups(model, config.weight_decay), lr=tr.peak_lr, betas=(0.9, 0.95)
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupCosine(opts.steps, tr.warmup))
    mask_gen = torch.Generator(device=device)
    mask_gen.manual_seed(derive_seed(opts.seed, STREAM_MASK, ctx.rank))
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        _set_rng_state(ckpt["rng"][ctx.rank], mask_gen, device)
    net: nn.Module = model
    if ctx.enabled:
        net = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )

    sampler = EpochSampler(tr.plan, ctx.rank)
    epoch, offset = tr.plan.locate(start_step + 1)
    sampler.set_epoch(epoch, offset)
    poster = None
    if opts.hints is not None:  # every rank posts its own shard's order as its own stream
        base = opts.hints.stream or default_stream(tr.out)
        poster = HintPoster(opts.hints, f"{base}.rank{ctx.rank}", tr.echo)
    if poster is not None:  # this epoch and the next, so the cache always sees ahead
        poster.post(epoch_read_order(tr.plan, tr.info, epoch, ctx.rank), append=False)
        poster.post(epoch_read_order(tr.plan, tr.info, epoch + 1, ctx.rank), append=True)
    loader_gen = torch.Generator()
    loader_gen.manual_seed(derive_seed(opts.seed, _STREAM_LOADER, ctx.rank, epoch))
    workers = opts.workers
    loader = DataLoader(
        tr.dataset,
        batch_size=tr.batch_size,
        sampler=sampler,
        drop_last=True,
        num_workers=workers,
        multiprocessing_context=opts.mp_context if workers > 0 else None,
        persistent_workers=workers > 0,
        worker_init_fn=worker_init if workers > 0 else None,
        pin_memory=device.type == "cuda",
        generator=loader_gen,
    )

    def save(step: int) -> None:
        states = [_rng_state(mask_gen, device)]
        if ctx.enabled:
            gathered: list[Any] = [None] * ctx.world_size
            dist.all_gather_object(gathered, states[0])
            states = gathered
        if ctx.is_main:
            _atomic_save(
                {
                    "format": CHECKPOINT_FORMAT,
                    "step": step,
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "rng": states,
                    "stats": asdict(tr.dataset.stats),
                    "volume": asdict(tr.info),
                    "data": str(opts.data),
                    **tr.identity(),
                },
                tr.ckpt_path,
            )

    losses: list[float] = []
    waits: list[float] = []
    step_times: list[float] = []
    window = _Window()
    reads = hashlib.sha256()
    read_count = 0
    time_to_first_batch = 0.0
    global_batch = tr.batch_size * ctx.world_size
    model.train()
    metrics = _open_metrics(tr.out / "metrics.jsonl", start_step) if ctx.is_main else None
    try:
        t_start = time.perf_counter()
        iterator: Iterator[Any] = iter(loader)
        for step in range(start_step + 1, tr.stop + 1):
            t0 = t_start if step == start_step + 1 else time.perf_counter()
            try:
                batch, corners = next(iterator)
            except StopIteration:
                epoch += 1
                sampler.set_epoch(epoch, 0)
                if poster is not None:
                    poster.post(
                        epoch_read_order(tr.plan, tr.info, epoch + 1, ctx.rank), append=True
                    )
                iterator = iter(loader)
                batch, corners = next(iterator)
            t1 = time.perf_counter()
            if step == start_step + 1:
                time_to_first_batch = t1 - t_start
            reads.update(corners.numpy().astype("<i8").tobytes())
            read_count += len(corners)

            lr = float(optimizer.param_groups[0]["lr"])
            x = batch.to(device, non_blocking=True)
            with autocast(device, tr.amp):
                loss = net(x, generator=mask_gen).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if opts.clip_grad > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), opts.clip_grad)
            optimizer.step()
            scheduler.step()
            reported = loss.detach().float()
            if ctx.enabled:
                reported = reported.clone()
                dist.all_reduce(reported)
                reported /= ctx.world_size
            loss_value = float(reported)  # synchronises with the device
            t2 = time.perf_counter()
            if not math.isfinite(loss_value):
                raise FitError(f"loss became non-finite ({loss_value}) at step {step}")

            losses.append(loss_value)
            waits.append(t1 - t0)
            step_times.append(t2 - t0)
            window.add(loss_value, t1 - t0, t2 - t0)
            if step % opts.log_every == 0 or step == tr.stop:
                if metrics is not None:
                    _write_json_line(
                        metrics,
                        {
                            "step": step,
                            "epoch": epoch,
                            "loss": window.loss_sum / window.steps,
                            "lr": lr,
                            "samples_per_s": window.steps * global_batch / window.step_s,
                            "data_wait_fraction": window.wait_s / window.step_s,
                            "data_wait_s": window.wait_s,
                            "step_time_s": window.step_s / window.steps,
                            "elapsed_s": t2 - t_start,
                        },
                    )
                window = _Window()
            last = step == tr.stop
            if opts.checkpoint and (
                last or (opts.checkpoint_every and step % opts.checkpoint_every == 0)
            ):
                save(step)
        elapsed = time.perf_counter() - t_start
    finally:
        if metrics is not None:
            metrics.close()
        if poster is not None:
            poster.close()
    del iterator, loader  # stops persistent workers

    steps_run = tr.stop - start_step
    steady_steps = step_times[1:] or step_times
    steady_waits = waits[1:] or waits
    samples = steps_run * global_batch
    head = losses[: min(10, len(losses))]
    tail = losses[-min(10, len(losses)) :]
    digest = params_digest(model)
    summary: dict[str, Any] = {
        "steps": steps_run,
        "start_step": start_step,
        "end_step": tr.stop,
        "total_steps": opts.steps,
        "resumed": ckpt is not None,
        "batch_size": tr.batch_size,
        "world_size": ctx.world_size,
        "samples": samples,
        "elapsed_s": elapsed,
        "samples_per_s": len(steady_steps) * global_batch / sum(steady_steps),
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
            "variable": tr.info.variable,
            "trace_mask": tr.info.mask_variable,
            "shape": list(tr.info.shape),
            "chunks": list(tr.info.chunks),
            "dtype": tr.info.dtype,
            "mean": tr.dataset.stats.mean,
            "std": tr.dataset.stats.std,
            "clip_sigma": tr.dataset.stats.clip,
            "scale": tr.dataset.stats.scale,
            "stats_source": tr.dataset.stats.source,
        },
        "plan": tr.plan.spec.to_dict(),
        "steps_per_epoch": tr.plan.steps_per_epoch,
        "preset": asdict(config),
        "parameters": sum(p.numel() for p in model.parameters()),
        "params_digest": digest,
        "epochs_started": epoch + 1,
        "epoch_size": opts.epoch_size,
        "workers": workers,
        "mp_context": opts.mp_context if workers > 0 else None,
        "threads": threads,
        "device": str(device),
        "amp": "bf16" if tr.amp else None,
        "seed": opts.seed,
        "lr": tr.peak_lr,
        "warmup_steps": tr.warmup,
        "checkpoint": str(tr.ckpt_path) if opts.checkpoint else None,
    }
    text = json.dumps(summary, indent=2)
    summary = json.loads(text)  # the caller sees exactly what the file holds
    if ctx.enabled:
        _write_json(
            tr.out / f"rank-{ctx.rank}.json",
            {
                "rank": ctx.rank,
                "world_size": ctx.world_size,
                "first_step": start_step + 1,
                "last_step": tr.stop,
                "reads": read_count,
                "read_digest": reads.hexdigest(),
                "params_digest": digest,
            },
        )
    if ctx.is_main:
        _write_json(tr.out / "summary.json", summary)
        _echo_summary(tr, summary, threads)
    if ctx.enabled:
        dist.barrier()  # every rank's files are complete when the launcher returns
    return summary


def _echo_summary(tr: _Trainer, summary: dict[str, Any], threads: int) -> None:
    tail = min(10, summary["steps"])
    ranks = f" on {tr.ctx.world_size} ranks" if tr.ctx.enabled else ""
    tr.echo(
        f"trained steps {summary['start_step'] + 1}-{summary['end_step']} of "
        f"{summary['total_steps']} x {summary['batch_size']}{ranks} = {summary['samples']} "
        f"patches of {'x'.join(map(str, tr.config.input_size))} in {summary['elapsed_s']:.1f} s "
        f"(first batch after {summary['time_to_first_batch_s']:.2f} s)"
    )
    tr.echo(
        f"throughput {summary['samples_per_s']:.1f} samples/s, "
        f"data wait {100 * summary['data_wait_fraction']:.1f}% of step time "
        f"({summary['workers']} workers, {threads} threads, {summary['device']}"
        f"{', bf16 autocast' if tr.amp else ''})"
    )
    tr.echo(
        f"loss {summary['loss_first10_mean']:.3f} -> {summary['loss_last10_mean']:.3f} "
        f"(mean of first/last {tail} steps)"
    )
    tr.echo(f"wrote {tr.out / 'summary.json'} and {tr.out / 'metrics.jsonl'}")


__all__ = [
    "CHECKPOINT_NAME",
    "DEFAULT_OUT",
    "DataError",
    "DistContext",
    "FitError",
    "FitOptions",
    "WarmupCosine",
    "autocast",
    "available_cpus",
    "build_dataset",
    "check_out_dir",
    "default_threads",
    "dist_context_from_env",
    "fit",
    "load_checkpoint",
    "lr_at",
    "param_groups",
    "params_digest",
    "select_device",
]
