"""3D Vision Transformer masked autoencoder for seismic volumes.

A direct 3D transcription of MAE (He et al. 2022, "Masked Autoencoders Are
Scalable Vision Learners", https://arxiv.org/abs/2111.06377), the recipe behind
TGS's seismic foundation models:

* the input sub-volume ``(B, 1, I, X, T)`` is cut into non-overlapping tokens of
  ``patch_size`` samples and linearly embedded;
* fixed sin-cos positional embeddings (Vaswani et al. 2017, "Attention Is All
  You Need"; MAE's 2D variant extended here to three axes) are added;
* a random ``mask_ratio`` of the tokens is dropped per sample and only the
  visible ones go through the encoder;
* a lighter decoder sees the encoded tokens plus a shared learned mask token
  at every hidden position and predicts each hidden token's samples;
* the loss is the mean squared error on the hidden tokens only, against
  targets normalised per token (MAE's ``norm_pix_loss``).

There is no class token: the encoder output is meant to be pooled or used per
token downstream. Attention uses ``torch.nn.functional.scaled_dot_product_attention``
(fused kernels where the device has them). The model runs under bf16 autocast on
CUDA (see :mod:`trainer.train`); the loss is always computed in float32.

The encoder is a ViT (Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words:
Transformers for Image Recognition at Scale", https://arxiv.org/abs/2010.11929)
over 3D tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from trainer.presets import MAEConfig, Shape3

NORM_PIX_EPS = 1e-6
"""Added to each target token's variance before normalising it (MAE's value)."""


def _sincos_1d(dim: int, positions: np.ndarray) -> np.ndarray:
    """Sin-cos embedding of 1D positions: ``(N,) -> (N, dim)``; ``dim`` even."""
    omega = np.arange(dim // 2, dtype=np.float64) / (dim / 2.0)
    omega = 1.0 / 10000**omega
    out = np.einsum("n,d->nd", positions.reshape(-1).astype(np.float64), omega)
    return np.concatenate([np.sin(out), np.cos(out)], axis=1)


def axis_dims(embed_dim: int) -> Shape3:
    """Split an embedding width over the three axes, each share even.

    Args:
        embed_dim: Total width; must be even.

    Returns:
        Widths for (inline, crossline, time), as equal as possible, summing to
        ``embed_dim``; the first axes get the remainder.

    Raises:
        ValueError: If ``embed_dim`` is odd or smaller than 6.
    """
    if embed_dim % 2 != 0 or embed_dim < 6:
        raise ValueError(f"embedding width must be even and >= 6, got {embed_dim}")
    base = (embed_dim // 6) * 2
    dims = [base, base, base]
    rest = embed_dim - 3 * base
    k = 0
    while rest > 0:
        dims[k] += 2
        rest -= 2
        k += 1
    return (dims[0], dims[1], dims[2])


def sincos_pos_embed_3d(embed_dim: int, grid_size: Shape3) -> torch.Tensor:
    """Fixed 3D sin-cos positional embedding.

    Each axis gets its own 1D sin-cos embedding (Vaswani et al. 2017) over its
    token index, on an even share of the width (:func:`axis_dims`); the three
    are concatenated, as MAE concatenates its two for 2D images.

    Args:
        embed_dim: Embedding width; must be even and >= 6.
        grid_size: Tokens along (inline, crossline, time).

    Returns:
        float32 tensor ``(I*X*T, embed_dim)``, tokens in C order (time fastest).

    Raises:
        ValueError: If ``embed_dim`` is odd or smaller than 6.
    """
    dims = axis_dims(embed_dim)
    grids = np.meshgrid(*(np.arange(n, dtype=np.float64) for n in grid_size), indexing="ij")
    parts = [_sincos_1d(d, g) for d, g in zip(dims, grids, strict=True)]
    return torch.from_numpy(np.concatenate(parts, axis=1)).float()


def patchify(x: torch.Tensor, patch_size: Shape3) -> torch.Tensor:
    """Cut volumes into flattened tokens.

    Args:
        x: ``(B, 1, I, X, T)`` volumes; each spatial size divisible by the token size.
        patch_size: Token size ``(pi, px, pt)``.

    Returns:
        ``(B, N, pi*px*pt)`` tokens, ``N = (I/pi)*(X/px)*(T/pt)`` in C order.
    """
    b, c, i, x_, t = x.shape
    pi, px, pt = patch_size
    gi, gx, gt = i // pi, x_ // px, t // pt
    x = x.reshape(b, c, gi, pi, gx, px, gt, pt)
    x = x.permute(0, 2, 4, 6, 3, 5, 7, 1)
    return x.reshape(b, gi * gx * gt, pi * px * pt * c)


def unpatchify(tokens: torch.Tensor, patch_size: Shape3, grid_size: Shape3) -> torch.Tensor:
    """Inverse of :func:`patchify` for single-channel volumes.

    Args:
        tokens: ``(B, N, pi*px*pt)`` tokens.
        patch_size: Token size ``(pi, px, pt)``.
        grid_size: Tokens along each axis ``(gi, gx, gt)``.

    Returns:
        ``(B, 1, gi*pi, gx*px, gt*pt)`` volumes.
    """
    b = tokens.shape[0]
    pi, px, pt = patch_size
    gi, gx, gt = grid_size
    x = tokens.reshape(b, gi, gx, gt, pi, px, pt, 1)
    x = x.permute(0, 7, 1, 4, 2, 5, 3, 6)
    return x.reshape(b, 1, gi * pi, gx * px, gt * pt)


def random_masking(
    tokens: torch.Tensor, mask_ratio: float, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Keep a random subset of tokens per sample (MAE's per-sample shuffling).

    Args:
        tokens: ``(B, N, D)`` token embeddings.
        mask_ratio: Fraction of tokens to hide, in [0, 1).
        generator: Optional RNG for reproducible masks.

    Returns:
        ``(visible, mask, ids_restore)``: ``visible`` is ``(B, K, D)`` with
        ``K = int(N * (1 - mask_ratio))``; ``mask`` is ``(B, N)`` float, 1 for hidden
        tokens, in the original order; ``ids_restore`` ``(B, N)`` undoes the shuffle.
    """
    b, n, d = tokens.shape
    keep = int(n * (1.0 - mask_ratio))
    noise = torch.rand(b, n, device=tokens.device, generator=generator)
    ids_shuffle = torch.argsort(noise, dim=1)
    ids_restore = torch.argsort(ids_shuffle, dim=1)
    ids_keep = ids_shuffle[:, :keep]
    visible = torch.gather(tokens, 1, ids_keep.unsqueeze(-1).expand(-1, -1, d))
    mask = torch.ones(b, n, device=tokens.device)
    mask[:, :keep] = 0
    mask = torch.gather(mask, 1, ids_restore)
    return visible, mask, ids_restore


class Attention(nn.Module):
    """Multi-head self-attention through ``scaled_dot_product_attention``.

    Args:
        dim: Token width.
        num_heads: Number of heads; must divide ``dim``.

    Raises:
        ValueError: If ``num_heads`` does not divide ``dim``.
    """

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        if dim % num_heads != 0:
            raise ValueError(f"{num_heads} heads do not divide width {dim}")
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Attend over tokens: ``(B, N, D) -> (B, N, D)``."""
        b, n, d = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, d // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        out = F.scaled_dot_product_attention(q, k, v)
        projected: torch.Tensor = self.proj(out.transpose(1, 2).reshape(b, n, d))
        return projected


class Block(nn.Module):
    """Pre-norm Transformer block: attention and a GELU MLP, both residual.

    Args:
        dim: Token width.
        num_heads: Attention heads.
        mlp_ratio: MLP hidden width as a multiple of ``dim``.
    """

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0) -> None:
        super().__init__()
        hidden = int(dim * mlp_ratio)
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the block: ``(B, N, D) -> (B, N, D)``."""
        x = x + self.attn(self.norm1(x))
        out: torch.Tensor = x + self.mlp(self.norm2(x))
        return out


@dataclass
class MAEOutput:
    """Result of one masked-autoencoder forward pass.

    Attributes:
        loss: Scalar MSE over hidden tokens (normalised targets if ``norm_pix_loss``).
        pred: ``(B, N, patch_dim)`` predicted tokens (all positions).
        mask: ``(B, N)`` float mask, 1 where the token was hidden.
    """

    loss: torch.Tensor
    pred: torch.Tensor
    mask: torch.Tensor


class MaskedAutoencoder3D(nn.Module):
    """3D ViT masked autoencoder (MAE, He et al. 2022, extended to volumes).

    Args:
        config: Sizes and mask ratio (see :class:`trainer.presets.MAEConfig`).

    Raises:
        ValueError: If the configuration is inconsistent.
    """

    pos_embed: torch.Tensor
    decoder_pos_embed: torch.Tensor

    def __init__(self, config: MAEConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.patch_embed = nn.Linear(c.patch_dim, c.embed_dim)
        self.register_buffer(
            "pos_embed",
            sincos_pos_embed_3d(c.embed_dim, c.grid_size).unsqueeze(0),
            persistent=False,
        )
        self.blocks = nn.ModuleList(
            Block(c.embed_dim, c.num_heads, c.mlp_ratio) for _ in range(c.depth)
        )
        self.norm = nn.LayerNorm(c.embed_dim)

        self.decoder_embed = nn.Linear(c.embed_dim, c.decoder_embed_dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, c.decoder_embed_dim))
        self.register_buffer(
            "decoder_pos_embed",
            sincos_pos_embed_3d(c.decoder_embed_dim, c.grid_size).unsqueeze(0),
            persistent=False,
        )
        self.decoder_blocks = nn.ModuleList(
            Block(c.decoder_embed_dim, c.decoder_num_heads, c.mlp_ratio)
            for _ in range(c.decoder_depth)
        )
        self.decoder_norm = nn.LayerNorm(c.decoder_embed_dim)
        self.decoder_pred = nn.Linear(c.decoder_embed_dim, c.patch_dim)
        self._init_weights()

    def _init_weights(self) -> None:
        # MAE's initialisation: xavier-uniform linears, unit LayerNorms, N(0, 0.02) mask token.
        nn.init.normal_(self.mask_token, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        # Start the prediction head near zero: the first predictions are then ~0, the
        # mean of every normalised target token, so the initial loss is ~1.0 and any
        # value below 1 is structure the model has learned (xavier here starts ~1.7).
        nn.init.normal_(self.decoder_pred.weight, std=0.02)

    def _check_input(self, x: torch.Tensor) -> None:
        expected = (1, *self.config.input_size)
        if x.ndim != 5 or tuple(x.shape[1:]) != expected:
            raise ValueError(
                f"expected input (B, {', '.join(map(str, expected))}), got {tuple(x.shape)}"
            )

    def forward_encoder(
        self, x: torch.Tensor, mask_ratio: float, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Embed, mask and encode.

        Args:
            x: ``(B, 1, I, X, T)`` input volumes.
            mask_ratio: Fraction of tokens to hide.
            generator: Optional RNG for the mask.

        Returns:
            ``(latent, mask, ids_restore)``: ``latent`` ``(B, K, embed_dim)`` for the
            visible tokens, and :func:`random_masking`'s mask and restore indices.

        Raises:
            ValueError: If ``x`` does not have the configured shape.
        """
        self._check_input(x)
        tokens = self.patch_embed(patchify(x, self.config.patch_size)) + self.pos_embed
        visible, mask, ids_restore = random_masking(tokens, mask_ratio, generator)
        for block in self.blocks:
            visible = block(visible)
        return self.norm(visible), mask, ids_restore

    def forward_decoder(self, latent: torch.Tensor, ids_restore: torch.Tensor) -> torch.Tensor:
        """Decode visible latents plus mask tokens into all tokens.

        Args:
            latent: ``(B, K, embed_dim)`` encoded visible tokens.
            ids_restore: ``(B, N)`` indices undoing the masking shuffle.

        Returns:
            ``(B, N, patch_dim)`` predicted token samples.
        """
        x = self.decoder_embed(latent)
        b, k, d = x.shape
        n = ids_restore.shape[1]
        x = torch.cat([x, self.mask_token.expand(b, n - k, d)], dim=1)
        x = torch.gather(x, 1, ids_restore.unsqueeze(-1).expand(-1, -1, d))
        x = x + self.decoder_pos_embed
        for block in self.decoder_blocks:
            x = block(x)
        pred: torch.Tensor = self.decoder_pred(self.decoder_norm(x))
        return pred

    def forward_loss(self, x: torch.Tensor, pred: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Mean squared error on the hidden tokens.

        Args:
            x: ``(B, 1, I, X, T)`` input volumes.
            pred: ``(B, N, patch_dim)`` predictions.
            mask: ``(B, N)`` mask, 1 for hidden tokens.

        Returns:
            Scalar float32 loss; with ``norm_pix_loss`` each target token is first
            normalised to zero mean and unit variance (eps :data:`NORM_PIX_EPS`).
        """
        target = self.target_tokens(x)
        per_token = (pred.float() - target).pow(2).mean(dim=-1)
        mask = mask.float()
        return (per_token * mask).sum() / mask.sum().clamp_min(1.0)

    def target_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """The reconstruction targets: tokens of ``x``, normalised per token if configured.

        Computed in float32 whatever the autocast state, so a bf16 forward pass
        still gets a float32 loss.

        Args:
            x: ``(B, 1, I, X, T)`` input volumes.

        Returns:
            ``(B, N, patch_dim)`` float32 targets.
        """
        target = patchify(x.float(), self.config.patch_size)
        if self.config.norm_pix_loss:
            mean = target.mean(dim=-1, keepdim=True)
            var = target.var(dim=-1, keepdim=True)
            target = (target - mean) / torch.sqrt(var + NORM_PIX_EPS)
        return target

    def reconstruct(self, x: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
        """Turn predicted tokens back into volumes in the input's units.

        With ``norm_pix_loss`` the model predicts each token normalised by its own
        mean and variance; as in MAE's visualisations, those are taken from the
        true token of ``x`` to bring the prediction back to input units.

        Args:
            x: ``(B, 1, I, X, T)`` input volumes the prediction was made for.
            pred: ``(B, N, patch_dim)`` predicted tokens.

        Returns:
            ``(B, 1, I, X, T)`` float32 reconstruction (every token predicted).
        """
        pred = pred.float()
        if self.config.norm_pix_loss:
            tokens = patchify(x.float(), self.config.patch_size)
            mean = tokens.mean(dim=-1, keepdim=True)
            var = tokens.var(dim=-1, keepdim=True)
            pred = pred * torch.sqrt(var + NORM_PIX_EPS) + mean
        return unpatchify(pred, self.config.patch_size, self.config.grid_size)

    def forward(
        self,
        x: torch.Tensor,
        mask_ratio: float | None = None,
        generator: torch.Generator | None = None,
    ) -> MAEOutput:
        """Mask, encode, decode and score a batch.

        Args:
            x: ``(B, 1, I, X, T)`` input volumes.
            mask_ratio: Override of the configured mask ratio.
            generator: Optional RNG for the mask.

        Returns:
            Loss, predictions and mask.

        Raises:
            ValueError: If ``x`` does not have the configured shape.
        """
        ratio = self.config.mask_ratio if mask_ratio is None else mask_ratio
        latent, mask, ids_restore = self.forward_encoder(x, ratio, generator)
        pred = self.forward_decoder(latent, ids_restore)
        return MAEOutput(loss=self.forward_loss(x, pred, mask), pred=pred, mask=mask)
