"""Normalisation statistics of a volume: MDIO's ``statsV1`` when present, else a sampled estimate.

The parent process takes them once (:func:`volume_stats`) and hands them to every
DataLoader worker inside the :class:`~trainer.dataset.PatchDataset`;
:func:`normalise` applies them to a patch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr

from trainer.plan import STREAM_STATS, derive_seed, sample_positions
from trainer.presets import Shape3
from trainer.volume import DataError, FloatArray, VolumeInfo, open_store, read_live_mask

DEFAULT_CLIP = 3.0
"""Default clip level of normalised amplitudes, in standard deviations."""


@dataclass(frozen=True)
class VolumeStats:
    """Normalisation statistics of a volume.

    Patches are normalised as ``clip((x - mean) / std, -clip, clip) * scale``:
    a z-score, clipped at ``clip`` standard deviations, then scaled. The default
    ``scale=1`` keeps unit-variance z-scores (what the patch embedding's
    initialisation expects; measured to learn faster on F3 than ``[-1, 1]``);
    ``scale = 1 / clip`` maps to ``[-1, 1]``.

    Attributes:
        mean: Mean amplitude (data units).
        std: Standard deviation (data units, > 0).
        count: Number of samples behind the estimate.
        clip: Clip level in standard deviations (> 0).
        scale: Factor applied after clipping (> 0).
        source: ``"statsV1"`` (MDIO's whole-volume statistics) or ``"sample"``
            (estimated from random blocks).
    """

    mean: float
    std: float
    count: int
    clip: float = DEFAULT_CLIP
    scale: float = 1.0
    source: str = "sample"

    @property
    def peak_to_peak(self) -> float:
        """Range of normalised values, ``2 * clip * scale`` (the PSNR peak)."""
        return 2.0 * self.clip * self.scale


def _stats_from_mdio(arr: zarr.Array[Any], clip: float, scale: float) -> VolumeStats | None:
    """MDIO's ``statsV1`` attribute as :class:`VolumeStats`, or ``None`` if absent/unusable."""
    raw = arr.attrs.get("statsV1")
    try:
        s: Any = json.loads(raw) if isinstance(raw, str) else raw
        count = int(s["count"])
        total, total_sq = float(s["sum"]), float(s["sumSquares"])
    except (TypeError, ValueError, KeyError):
        return None
    if count <= 0 or not np.isfinite(total) or not np.isfinite(total_sq):
        return None
    mean = total / count
    std = float(np.sqrt(max(total_sq / count - mean * mean, 0.0)))
    if not np.isfinite(std) or std <= 1e-12 * max(1.0, abs(mean)):
        return None
    return VolumeStats(mean, std, count, clip, scale, source="statsV1")


def estimate_stats(
    info: VolumeInfo,
    patch: Shape3,
    seed: int = 0,
    blocks: int = 32,
    clip: float = DEFAULT_CLIP,
    scale: float = 1.0,
) -> VolumeStats:
    """Estimate the volume's amplitude mean and standard deviation from a sample.

    Reads ``blocks`` random patch-sized blocks (never the whole volume, which may
    be far larger than memory or only reachable over a slow mount), ignoring dead
    traces and non-finite samples. Computed once, in the parent process.

    Args:
        info: The volume.
        patch: Block shape to read (inline, crossline, time).
        seed: Seed for the block positions.
        blocks: Number of blocks to read.
        clip: Clip level (in standard deviations) stored in the result.
        scale: Post-clip scale stored in the result.

    Returns:
        The statistics (``source="sample"``); ``std`` is 1.0 for a constant volume.

    Raises:
        DataError: If the sample holds no finite live value.
    """
    group = open_store(info.path, info.storage_options)
    arr = group[info.variable]
    assert isinstance(arr, zarr.Array)
    mask = read_live_mask(info)
    positions = sample_positions(info.shape, patch, blocks, seed, mask)
    total, total_sq, count = 0.0, 0.0, 0
    for i, x, t in positions.tolist():
        block = np.asarray(arr[i : i + patch[0], x : x + patch[1], t : t + patch[2]])
        block = block.astype(np.float64)
        keep = np.isfinite(block)
        if mask is not None:
            keep &= mask[i : i + patch[0], x : x + patch[1], None]
        vals = block[keep]
        total += float(vals.sum())
        total_sq += float(np.square(vals).sum())
        count += int(vals.size)
    if count == 0:
        raise DataError(f"no finite live amplitude found in {info.path}")
    mean = total / count
    var = max(total_sq / count - mean * mean, 0.0)
    std = float(np.sqrt(var))
    if not np.isfinite(std) or std <= 1e-12 * max(1.0, abs(mean)):
        std = 1.0
    _check_clip_scale(clip, scale)
    return VolumeStats(mean=float(mean), std=std, count=count, clip=clip, scale=scale)


def _check_clip_scale(clip: float, scale: float) -> None:
    if not (clip > 0 and scale > 0):
        raise ValueError(f"clip ({clip}) and scale ({scale}) must be > 0")


def volume_stats(
    info: VolumeInfo,
    patch: Shape3,
    seed: int = 0,
    clip: float = DEFAULT_CLIP,
    scale: float = 1.0,
) -> VolumeStats:
    """The volume's normalisation statistics, exact when the store has them.

    MDIO writes whole-volume statistics into the amplitude variable's
    ``statsV1`` attribute while it converts (``count`` of non-zero live samples,
    ``sum``, ``sumSquares``); ``strata-train synth`` writes the same. These give
    the mean and standard deviation exactly (MDIO's convention: over the
    non-zero samples) without reading a single chunk. Stores without them get
    :func:`estimate_stats`.

    Args:
        info: The volume.
        patch: Block shape for the sampled fallback.
        seed: The run's seed (the fallback samples its own stream of it).
        clip: Clip level in standard deviations.
        scale: Post-clip scale.

    Returns:
        The statistics, with ``source`` saying where they came from.

    Raises:
        DataError: If the fallback finds no finite live value.
        ValueError: If ``clip`` or ``scale`` is not positive.
    """
    _check_clip_scale(clip, scale)
    arr = open_store(info.path, info.storage_options)[info.variable]
    assert isinstance(arr, zarr.Array)
    stats = _stats_from_mdio(arr, clip, scale)
    if stats is not None:
        return stats
    return estimate_stats(
        info, patch, seed=derive_seed(seed, STREAM_STATS) % 2**32, clip=clip, scale=scale
    )


def normalise(raw: np.ndarray[Any, Any], stats: VolumeStats) -> FloatArray:
    """Normalise raw amplitudes: z-score, clip, scale; non-finite samples become 0.

    Args:
        raw: Amplitudes of any shape and numeric dtype (data units).
        stats: The volume's statistics.

    Returns:
        float32 array of the same shape, values in ``[-clip*scale, clip*scale]``.
    """
    out = (raw.astype(np.float32) - np.float32(stats.mean)) / np.float32(stats.std)
    np.clip(out, -stats.clip, stats.clip, out=out)
    out *= np.float32(stats.scale)
    out[~np.isfinite(out)] = 0.0
    return out
