"""Model and optimiser presets for the seismic masked autoencoder.

This module is deliberately free of ``torch`` so that light-weight code paths
(``strata-train prepare``) can ask how large a training patch is without paying
for a PyTorch import.

Axis order everywhere in the trainer is ``(inline, crossline, time)``, the
order of MDIO's ``PostStack3DTime`` amplitude variable.
"""

from __future__ import annotations

from dataclasses import dataclass

Shape3 = tuple[int, int, int]


@dataclass(frozen=True)
class MAEConfig:
    """Shape and size of a 3D ViT masked autoencoder and its optimiser defaults.

    The architecture follows MAE (He et al. 2022, "Masked Autoencoders Are
    Scalable Vision Learners") with 2D image patches replaced by 3D seismic
    sub-volumes, as in TGS's seismic foundation models.

    Attributes:
        name: Preset name, recorded in summaries and checkpoints.
        input_size: Input patch (inline, crossline, time) in samples.
        patch_size: Token (ViT patch) size (inline, crossline, time) in samples;
            must divide ``input_size`` on every axis.
        embed_dim: Encoder width; must be even (sin-cos positional embedding).
        depth: Number of encoder Transformer blocks.
        num_heads: Encoder attention heads; must divide ``embed_dim``.
        decoder_embed_dim: Decoder width; must be even.
        decoder_depth: Number of decoder Transformer blocks.
        decoder_num_heads: Decoder attention heads; must divide ``decoder_embed_dim``.
        mlp_ratio: Hidden width of each block's MLP as a multiple of its width.
        mask_ratio: Fraction of tokens hidden from the encoder, in [0, 1).
        norm_pix_loss: Normalise each target token by its own mean and variance
            before the MSE (MAE's ``norm_pix_loss``).
        lr: Peak AdamW learning rate.
        weight_decay: AdamW weight decay.
        warmup_steps: Maximum number of linear learning-rate warm-up steps.
        batch_size: Default number of patches per optimiser step.

    Raises:
        ValueError: From ``__post_init__`` when the sizes are inconsistent.
    """

    name: str
    input_size: Shape3
    patch_size: Shape3
    embed_dim: int
    depth: int
    num_heads: int
    decoder_embed_dim: int
    decoder_depth: int
    decoder_num_heads: int
    mlp_ratio: float = 4.0
    mask_ratio: float = 0.75
    norm_pix_loss: bool = True
    lr: float = 1e-3
    weight_decay: float = 0.05
    warmup_steps: int = 20
    batch_size: int = 8

    def __post_init__(self) -> None:
        """Check that the sizes fit together.

        Raises:
            ValueError: If a token size does not divide the input size, a width is
                odd or not divisible by its head count, or the mask ratio leaves
                no visible token.
        """
        for axis, (n, p) in enumerate(zip(self.input_size, self.patch_size, strict=True)):
            if p <= 0 or n <= 0 or n % p != 0:
                raise ValueError(
                    f"patch size {self.patch_size} must divide input size {self.input_size} "
                    f"(axis {axis})"
                )
        for width, heads in (
            (self.embed_dim, self.num_heads),
            (self.decoder_embed_dim, self.decoder_num_heads),
        ):
            if width % 2 != 0 or heads <= 0 or width % heads != 0:
                raise ValueError(f"width {width} must be even and divisible by {heads} heads")
        if not 0.0 <= self.mask_ratio < 1.0:
            raise ValueError(f"mask ratio {self.mask_ratio} must be in [0, 1)")
        if self.num_visible < 1:
            raise ValueError(f"mask ratio {self.mask_ratio} leaves no visible token")

    @property
    def grid_size(self) -> Shape3:
        """Number of tokens along (inline, crossline, time)."""
        n = self.input_size
        p = self.patch_size
        return (n[0] // p[0], n[1] // p[1], n[2] // p[2])

    @property
    def num_patches(self) -> int:
        """Total number of tokens per input patch."""
        g = self.grid_size
        return g[0] * g[1] * g[2]

    @property
    def patch_dim(self) -> int:
        """Number of samples in one token (the reconstruction target size)."""
        p = self.patch_size
        return p[0] * p[1] * p[2]

    @property
    def num_visible(self) -> int:
        """Number of tokens the encoder sees: ``int(num_patches * (1 - mask_ratio))``."""
        return int(self.num_patches * (1.0 - self.mask_ratio))


PRESETS: dict[str, MAEConfig] = {
    # Sized for a laptop or a 2-core CI runner: 64 tokens of 4x4x8 samples, about
    # 1.06 M parameters.
    "tiny": MAEConfig(
        name="tiny",
        input_size=(16, 16, 32),
        patch_size=(4, 4, 8),
        embed_dim=128,
        depth=4,
        num_heads=4,
        decoder_embed_dim=96,
        decoder_depth=2,
        decoder_num_heads=3,
        lr=1e-3,
        warmup_steps=20,
        batch_size=8,
    ),
    # For GPUs: ViT-B-sized encoder (768 wide, 12 blocks, 12 heads, as in Dosovitskiy
    # et al. 2021 and MAE's ViT-B) and MAE's 512-wide, 8-block decoder, on 64^3-sample
    # cubes cut into 512 tokens of 8x8x8 samples; about 111 M parameters.
    "base": MAEConfig(
        name="base",
        input_size=(64, 64, 64),
        patch_size=(8, 8, 8),
        embed_dim=768,
        depth=12,
        num_heads=12,
        decoder_embed_dim=512,
        decoder_depth=8,
        decoder_num_heads=16,
        lr=1.5e-4,
        warmup_steps=200,
        batch_size=32,
    ),
}


def get_preset(name: str) -> MAEConfig:
    """Return the preset called ``name``.

    Args:
        name: One of the keys of :data:`PRESETS` (``"tiny"``, ``"base"``).

    Returns:
        The preset's configuration.

    Raises:
        ValueError: If no preset has that name.
    """
    try:
        return PRESETS[name]
    except KeyError:
        known = ", ".join(sorted(PRESETS))
        raise ValueError(f"unknown preset {name!r} (known: {known})") from None


def min_trace_samples() -> int:
    """Smallest number of samples per trace any preset can train on.

    Returns:
        The minimum of the presets' input sizes along time.
    """
    return min(p.input_size[2] for p in PRESETS.values())
