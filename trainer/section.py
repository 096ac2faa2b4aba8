"""The evaluation's section plot (``eval-section.png``): one inline section reconstructed
tile by tile (:class:`~trainer.reconstruct.Reconstructor`) and drawn as original, masked
input and reconstruction, on the volume's own axes where it has them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from trainer.reconstruct import Reconstructor
from trainer.volume import VolumeInfo, open_store


def _tile_starts(size: int, patch: int) -> list[int]:
    starts = list(range(0, size - patch + 1, patch))
    if starts[-1] != size - patch:
        starts.append(size - patch)
    return starts


def _axis(info: VolumeInfo, dim: int, name: str, fallback: str) -> tuple[list[float], str]:
    """Coordinate values and label of one amplitude axis (indices when absent)."""
    size = info.shape[dim]
    if name:
        try:
            arr = open_store(info.path, info.storage_options)[name]
        except KeyError:
            arr = None
        if isinstance(arr, zarr.Array) and arr.shape == (size,):
            values = np.asarray(arr[...], dtype=np.float64)
            if np.all(np.isfinite(values)) and (size < 2 or np.all(np.diff(values) > 0)):
                unit = " (ms)" if name == "time" else " (m)" if name == "depth" else ""
                return values.tolist(), f"{name}{unit}"
    return [float(v) for v in range(size)], f"{fallback} index"


def render_section(
    ev: Reconstructor, info: VolumeInfo, inline: int, path: Path, title: str
) -> dict[str, Any]:
    """Reconstruct one inline section tile by tile and draw it as a PNG.

    Args:
        ev: The evaluator (model, dataset, masks).
        info: The volume.
        inline: Inline index (0-based) of the section.
        path: PNG file to write.
        title: Figure title prefix.

    Returns:
        ``{"inline_index", "psnr_db"}`` of the section's hidden live samples.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pi, px, pt = ev.config.input_size
    n_il, n_xl, n_t = info.shape
    i0 = min(max(inline - pi // 2, 0), n_il - pi)
    offset = inline - i0
    corners = np.array(
        [(i0, x, t) for x in _tile_starts(n_xl, px) for t in _tile_starts(n_t, pt)], np.int64
    )
    original = np.zeros((n_xl, n_t), np.float32)
    shown = np.zeros((n_xl, n_t), np.float32)
    recon = np.zeros((n_xl, n_t), np.float32)
    hidden = np.zeros((n_xl, n_t), bool)
    weight = np.zeros((n_xl, n_t), bool)
    for start in range(0, len(corners), 64):
        batch = corners[start : start + 64]
        r = ev.run(batch)
        for k, (_, x, t) in enumerate(batch.tolist()):
            sl = np.s_[x : x + px, t : t + pt]
            orig = r["x"][k, 0, offset].numpy()
            hid = r["hidden"][k, 0, offset].numpy()
            original[sl] = orig
            hidden[sl] = hid
            weight[sl] = r["weight"][k, 0, offset].numpy()
            shown[sl] = np.where(hid, np.nan, orig)
            recon[sl] = np.where(hid, r["recon"][k, 0, offset].numpy(), orig)
    err = (recon - original)[weight]
    mse = float(np.mean(err**2)) if err.size else float("nan")
    peak = ev.dataset.stats.peak_to_peak
    psnr = 10 * math.log10(peak**2 / mse) if mse > 0 else float("inf")

    vmax = float(np.percentile(np.abs(original), 99)) or 1.0
    cmap = plt.get_cmap("seismic").copy()
    cmap.set_bad("0.6")
    xaxis, xlabel = _axis(info, 1, "crossline", "crossline")
    taxis, tlabel = _axis(info, 2, info.dims[2] if len(info.dims) == 3 else "", "sample")
    extent = (xaxis[0] - 0.5, xaxis[-1] + 0.5, taxis[-1], taxis[0])
    width = max(9.0, min(18.0, 9.0 * n_xl / max(n_t, 1) + 3))
    fig, axes = plt.subplots(1, 3, figsize=(width, 4.8), sharey=True, constrained_layout=True)
    panels = (
        ("original", original),
        (f"masked input ({ev.mask_ratio:.0%} hidden)", shown),
        ("reconstruction", recon),
    )
    for ax, (name, img) in zip(axes, panels, strict=True):
        ax.imshow(
            np.ma.masked_invalid(img.T),
            cmap=cmap,
            vmin=-vmax,
            vmax=vmax,
            aspect="auto",
            interpolation="nearest",
            extent=extent,
        )
        ax.set_title(name)
        ax.set_xlabel(xlabel)
    axes[0].set_ylabel(tlabel)
    fig.suptitle(f"{title}: hidden-sample PSNR {psnr:.1f} dB")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return {"inline_index": inline, "psnr_db": psnr}
