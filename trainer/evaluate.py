"""Evaluation of a trained masked autoencoder (``strata-train eval``).

Two results, both written next to the checkpoint unless ``--out`` says otherwise
(never under the data path):

* ``eval.json``: reconstruction PSNR on held-out patches. Each patch is masked
  as in training (MAE, He et al. 2022) and the hidden part is reconstructed;
  ``PSNR = 10 log10(peak^2 / MSE)`` over the hidden samples of live traces,
  in normalised units, with ``peak`` the normalised range ``2 * clip * scale``.
  With ``norm_pix_loss`` the predicted tokens are brought back to input units
  with each true token's mean and variance (MAE's visualisation convention),
  so the baseline that predicts every hidden token as its own mean is
  reported alongside (``baseline_psnr_db``): the model is useful where it beats it.
* ``eval-section.png``: one inline section, tiled with patches: original,
  masked input (hidden tokens grey) and reconstruction (visible tokens pasted
  back, hidden ones predicted).

The model run on masked patches is :mod:`trainer.reconstruct`'s; drawing the section,
:mod:`trainer.section`'s.

Held-out patches: positions drawn from the evaluation seed stream, excluding
every position the checkpoint's training plan visited (computable exactly,
:class:`trainer.plan.EpochPlan`) when the volume has the training volume's
shape. A small volume can be exhausted by training (F3 has about a thousand
patch positions); ``held_out_fraction`` reports how many evaluation patches
were never trained on.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zarr

from trainer.checkpoint import load_checkpoint
from trainer.dataset import PatchDataset
from trainer.distributed import default_threads, select_device
from trainer.location import StorageOptions
from trainer.model import MaskedAutoencoder3D
from trainer.options import FitError, check_out_dir
from trainer.plan import STREAM_EVAL, EpochPlan, PlanSpec, PositionSampler, derive_seed
from trainer.presets import MAEConfig, Shape3
from trainer.reconstruct import Reconstructor
from trainer.section import render_section
from trainer.stats import volume_stats
from trainer.volume import (
    BoolArray,
    DataError,
    IntArray,
    check_fits,
    inspect_volume,
    open_store,
    read_live_mask,
)

SECTION_PNG = "eval-section.png"
EVAL_JSON = "eval.json"


class EvalError(Exception):
    """Evaluation cannot run; the message is one line."""


@dataclass(frozen=True)
class EvalOptions:
    """Options of one evaluation.

    Attributes:
        ckpt: Checkpoint written by ``strata-train fit``.
        data: Zarr/MDIO store to evaluate on (read-only): a directory or an fsspec URL.
        out: Output directory; ``None`` for the checkpoint's directory.
        patches: Number of held-out patches for the PSNR.
        batch_size: Patches per forward pass.
        seed: Seed of the evaluation positions and masks.
        mask_ratio: Fraction of tokens hidden; ``None`` for the model's.
        inline: Inline index (0-based, into the volume) of the section;
            ``None`` for the middle one.
        device: ``"auto"``, ``"cpu"`` or ``"cuda"``.
        threads: Torch intra-op threads; ``None`` for all cores.
        amp: bf16 autocast; ``None`` for CUDA only.
        storage_options: fsspec options of a URL ``data`` (see :mod:`trainer.volume`).
    """

    ckpt: Path
    data: str | Path
    out: Path | None = None
    patches: int = 256
    batch_size: int = 32
    seed: int = 0
    mask_ratio: float | None = None
    inline: int | None = None
    device: str = "auto"
    threads: int | None = None
    amp: bool | None = None
    storage_options: StorageOptions = field(default_factory=dict, repr=False)


def _plan_spec(raw: dict[str, Any]) -> PlanSpec:
    def t3(v: Any) -> Shape3:
        return (int(v[0]), int(v[1]), int(v[2]))

    return PlanSpec(
        shape=t3(raw["shape"]),
        patch=t3(raw["patch"]),
        epoch_size=int(raw["epoch_size"]),
        batch_size=int(raw["batch_size"]),
        world_size=int(raw["world_size"]),
        seed=int(raw["seed"]),
        min_live_fraction=float(raw["min_live_fraction"]),
        align_chunks=None if raw["align_chunks"] is None else t3(raw["align_chunks"]),
    )


def trained_positions(spec: PlanSpec, steps: int, live_mask: BoolArray | None) -> IntArray:
    """Every patch corner a run with this plan trained on in its first ``steps`` steps.

    Args:
        spec: The run's plan spec (from its checkpoint).
        steps: Optimiser steps taken.
        live_mask: The volume's live mask (the plan depends on it).

    Returns:
        int64 ``(M, 3)`` corners, all ranks, repeats included.
    """
    plan = EpochPlan(spec, live_mask)
    per_step = spec.batch_size * spec.world_size
    parts = []
    epoch = 0
    left = steps
    while left > 0:
        n = min(left, plan.steps_per_epoch)
        parts.append(plan.positions(epoch)[: n * per_step])
        left -= n
        epoch += 1
    if not parts:
        return np.zeros((0, 3), dtype=np.int64)
    return np.concatenate(parts)


def _keys(positions: IntArray, shape: Shape3) -> IntArray:
    p = positions.astype(np.int64)
    keys: IntArray = (p[:, 0] * shape[1] + p[:, 1]) * shape[2] + p[:, 2]
    return keys


def held_out_positions(
    sampler: PositionSampler,
    count: int,
    seed: int,
    exclude: IntArray,
    rounds: int = 16,
) -> tuple[IntArray, int]:
    """Draw ``count`` distinct corners, avoiding ``exclude`` where possible.

    Args:
        sampler: Eligible positions of the volume.
        count: Corners wanted.
        seed: Evaluation seed.
        exclude: Corners to avoid (e.g. every trained one), ``(M, 3)``.
        rounds: Draws of ``4 * count`` candidates before giving up on avoiding.

    Returns:
        ``(corners (count, 3), how many are not in exclude)``; when too few unseen
        corners exist, the rest are drawn from the excluded ones.
    """
    rng = np.random.default_rng(derive_seed(seed, STREAM_EVAL, 0))
    shape = sampler.shape
    banned = np.unique(_keys(exclude, shape)) if len(exclude) else np.zeros(0, np.int64)
    chosen: list[IntArray] = []
    chosen_keys = np.zeros(0, dtype=np.int64)
    for _ in range(rounds):
        cand = sampler.draw(4 * count, rng)
        keys = _keys(cand, shape)
        _, first = np.unique(keys, return_index=True)
        first.sort()
        cand, keys = cand[first], keys[first]
        ok = ~np.isin(keys, banned) & ~np.isin(keys, chosen_keys)
        chosen.append(cand[ok])
        chosen_keys = np.concatenate([chosen_keys, keys[ok]])
        if len(chosen_keys) >= count:
            break
    unseen = np.concatenate(chosen)[:count] if chosen else np.zeros((0, 3), np.int64)
    fill = sampler.draw(count - len(unseen), rng)
    return np.concatenate([unseen, fill]).astype(np.int64), len(unseen)


def _coordinate(group: zarr.Group, name: str, index: int, size: int) -> int:
    """Inline/crossline number at ``index`` when the store has that coordinate."""
    try:
        arr = group[name]
    except KeyError:
        return index
    if isinstance(arr, zarr.Array) and arr.shape == (size,):
        return int(np.asarray(arr[index]))
    return index


def evaluate(opts: EvalOptions, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Evaluate a checkpoint: PSNR on held-out patches and an inline-section PNG.

    Args:
        opts: Evaluation options.
        echo: Receives the human summary lines.

    Returns:
        The contents of ``eval.json``: ``psnr_db``, ``baseline_psnr_db``, ``mse``,
        ``loss``, ``patches``, ``held_out``, ``held_out_fraction``,
        ``mask_ratio``, ``peak_to_peak``, ``section`` (inline, PSNR, PNG path),
        ``checkpoint_step`` and paths.

    Raises:
        DataError: If the data path is unusable.
        EvalError: On invalid options, an unreadable checkpoint, or an output
            directory inside the data path.
    """
    if opts.patches < 1 or opts.batch_size < 1:
        raise EvalError("--patches and --batch-size must be >= 1")
    if opts.threads is not None and opts.threads < 1:
        raise EvalError(f"--threads must be >= 1, got {opts.threads}")
    try:
        ckpt = load_checkpoint(Path(opts.ckpt))
        device = select_device(opts.device)
        out = Path(opts.out) if opts.out is not None else Path(opts.ckpt).parent
        info = inspect_volume(opts.data, opts.storage_options)
        check_out_dir(opts.data, out)
    except FitError as exc:
        raise EvalError(str(exc)) from None
    config = MAEConfig(**ckpt["preset"])
    mask_ratio = config.mask_ratio if opts.mask_ratio is None else opts.mask_ratio
    if not 0.0 < mask_ratio < 1.0 or int(config.num_patches * (1 - mask_ratio)) < 1:
        raise EvalError(f"--mask-ratio {mask_ratio} must hide some tokens and leave one visible")
    patch = config.input_size
    check_fits(info, patch)
    inline = info.shape[0] // 2 if opts.inline is None else opts.inline
    if not 0 <= inline < info.shape[0]:
        raise EvalError(f"--inline {inline} is outside [0, {info.shape[0]})")

    torch.set_num_threads(opts.threads or default_threads(0))
    amp = device.type == "cuda" if opts.amp is None else opts.amp
    trained_stats = ckpt["stats"]
    stats = volume_stats(info, patch, opts.seed, trained_stats["clip"], trained_stats["scale"])
    dataset = PatchDataset(info, patch, stats)
    live = read_live_mask(info)
    spec = _plan_spec(ckpt["plan"])
    sampler = PositionSampler(info.shape, patch, live, spec.min_live_fraction)
    seen = (
        trained_positions(spec, int(ckpt["step"]), live)
        if spec.shape == info.shape
        else np.zeros((0, 3), np.int64)
    )
    corners, held_out = held_out_positions(sampler, opts.patches, opts.seed, seen)

    model = MaskedAutoencoder3D(config)
    model.load_state_dict(ckpt["model"])
    model.to(device).eval()
    ev = Reconstructor(model, dataset, live, device, amp, mask_ratio, opts.seed)

    sq = base_sq = 0.0
    count = 0
    losses: list[float] = []
    for start in range(0, len(corners), opts.batch_size):
        r = ev.run(corners[start : start + opts.batch_size])
        w = r["weight"]
        sq += float(((r["recon"] - r["x"]) ** 2)[w].double().sum())
        base_sq += float(((r["baseline"] - r["x"]) ** 2)[w].double().sum())
        count += int(w.sum())
        losses.append(float(r["loss"]) * len(r["x"]))
    if count == 0:
        raise DataError("evaluation patches hold no hidden live sample")
    mse, base_mse = sq / count, base_sq / count
    peak = stats.peak_to_peak

    def psnr(err: float) -> float:
        return 10 * math.log10(peak**2 / err) if err > 0 else float("inf")

    out.mkdir(parents=True, exist_ok=True)
    group = open_store(info.path, info.storage_options)
    number = _coordinate(group, "inline", inline, info.shape[0])
    png = out / SECTION_PNG
    section = render_section(ev, info, inline, png, f"inline {number}")
    result: dict[str, Any] = {
        "psnr_db": psnr(mse),
        "baseline_psnr_db": psnr(base_mse),
        "mse": mse,
        "baseline_mse": base_mse,
        "loss": sum(losses) / len(corners),
        "patches": len(corners),
        "held_out": held_out,
        "held_out_fraction": held_out / len(corners),
        "hidden_samples": count,
        "mask_ratio": mask_ratio,
        "peak_to_peak": peak,
        "section": {**section, "inline": number, "png": str(png)},
        "checkpoint": str(opts.ckpt),
        "checkpoint_step": int(ckpt["step"]),
        "data": str(opts.data),
        "seed": opts.seed,
        "device": str(device),
    }
    (out / EVAL_JSON).write_text(json.dumps(result, indent=2) + "\n")
    echo(
        f"PSNR {result['psnr_db']:.2f} dB on hidden samples of {len(corners)} patches "
        f"({held_out} never trained on); token-mean baseline {result['baseline_psnr_db']:.2f} dB"
    )
    echo(f"inline {number}: section PSNR {section['psnr_db']:.2f} dB, wrote {png}")
    echo(f"wrote {out / EVAL_JSON}")
    return result
