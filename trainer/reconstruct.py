"""A trained masked autoencoder run on patches for evaluation (:class:`Reconstructor`):
each batch masked as in training (MAE, He et al. 2022) from the evaluation seed stream,
reconstructed, and returned with the hidden and live-trace masks that the held-out PSNR
and the section plot (:mod:`trainer.evaluate`, :mod:`trainer.section`) score.
"""

from __future__ import annotations

import numpy as np
import torch

from trainer.dataset import PatchDataset
from trainer.distributed import autocast
from trainer.model import MaskedAutoencoder3D, patchify, unpatchify
from trainer.plan import STREAM_EVAL, derive_seed
from trainer.presets import MAEConfig
from trainer.volume import BoolArray, IntArray


def _voxel_mask(token_mask: torch.Tensor, config: MAEConfig) -> torch.Tensor:
    """``(B, N)`` token mask to a ``(B, 1, I, X, T)`` boolean voxel mask."""
    tokens = token_mask.float()[..., None].expand(-1, -1, config.patch_dim)
    return unpatchify(tokens, config.patch_size, config.grid_size) > 0.5


def _token_mean_volume(x: torch.Tensor, config: MAEConfig) -> torch.Tensor:
    tokens = patchify(x.float(), config.patch_size)
    means = tokens.mean(dim=-1, keepdim=True).expand_as(tokens)
    return unpatchify(means.contiguous(), config.patch_size, config.grid_size)


class Reconstructor:
    """A checkpoint's model run on patches the way training masks them (its own seed
    stream), for the held-out PSNR and the section plot."""

    def __init__(
        self,
        model: MaskedAutoencoder3D,
        dataset: PatchDataset,
        live: BoolArray | None,
        device: torch.device,
        amp: bool,
        mask_ratio: float,
        seed: int,
    ) -> None:
        self.model = model
        self.config = model.config
        self.dataset = dataset
        self.live = live
        self.device = device
        self.amp = amp
        self.mask_ratio = mask_ratio
        self.gen = torch.Generator(device=device)
        self.gen.manual_seed(derive_seed(seed, STREAM_EVAL, 1))

    def run(self, corners: IntArray) -> dict[str, torch.Tensor]:
        """Mask, reconstruct and score a batch of patches (all float32, on the CPU)."""
        x = torch.stack([self.dataset[c][0] for c in corners.tolist()]).to(self.device)
        with torch.no_grad(), autocast(self.device, self.amp):
            out = self.model(x, mask_ratio=self.mask_ratio, generator=self.gen)
        recon = self.model.reconstruct(x, out.pred)
        hidden = _voxel_mask(out.mask, self.config)
        weight = hidden.clone()
        if self.live is not None:
            pi, px, _ = self.config.input_size
            live = np.stack([self.live[i : i + pi, j : j + px] for i, j, _ in corners.tolist()])
            weight &= torch.from_numpy(live)[:, None, :, :, None].to(self.device)
        return {
            "x": x.float().cpu(),
            "recon": recon.cpu(),
            "baseline": _token_mean_volume(x, self.config).cpu(),
            "hidden": hidden.cpu(),
            "weight": weight.cpu(),
            "loss": out.loss.float().cpu(),
        }
