"""Unit tests of the 3D ViT masked autoencoder (trainer.model) and its presets."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from trainer.model import (
    MaskedAutoencoder3D,
    axis_dims,
    patchify,
    random_masking,
    sincos_pos_embed_3d,
    unpatchify,
)
from trainer.presets import PRESETS, MAEConfig, get_preset, min_trace_samples

TINY = PRESETS["tiny"]


def test_tiny_preset_matches_the_documented_sizes() -> None:
    assert TINY.input_size == (16, 16, 32)
    assert TINY.patch_size == (4, 4, 8)
    assert TINY.grid_size == (4, 4, 4)
    assert TINY.num_patches == 64
    assert TINY.patch_dim == 128
    assert TINY.num_visible == 16
    assert (TINY.embed_dim, TINY.depth, TINY.num_heads) == (128, 4, 4)
    assert (TINY.decoder_embed_dim, TINY.decoder_depth) == (96, 2)
    assert TINY.mask_ratio == 0.75
    assert min_trace_samples() == 32


@pytest.mark.parametrize(
    "change",
    [
        {"patch_size": (5, 4, 8)},  # does not divide 16
        {"embed_dim": 130},  # not divisible by 4 heads
        {"decoder_embed_dim": 95, "decoder_num_heads": 5},  # odd width
        {"mask_ratio": 1.0},
        {"mask_ratio": 0.999},  # leaves no visible token
    ],
)
def test_inconsistent_config_is_rejected(change: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        dataclasses.replace(TINY, **change)  # type: ignore[arg-type]


def test_unknown_preset_is_a_value_error() -> None:
    assert get_preset("base").patch_size == (8, 8, 8)
    with pytest.raises(ValueError, match="unknown preset"):
        get_preset("huge")


def _parameters(config: MAEConfig) -> int:
    with torch.device("meta"):  # sizes only, no memory
        model = MaskedAutoencoder3D(config)
    return sum(p.numel() for p in model.parameters())


def test_tiny_has_about_a_million_parameters() -> None:
    assert 0.9e6 < _parameters(TINY) < 1.2e6


def test_base_is_vit_b_sized() -> None:
    base = get_preset("base")
    assert (base.embed_dim, base.depth, base.num_heads) == (768, 12, 12)  # ViT-B
    assert (base.decoder_embed_dim, base.decoder_depth, base.decoder_num_heads) == (512, 8, 16)
    assert base.input_size == (64, 64, 64) and base.num_patches == 512
    encoder = 12 * (12 * 768 * 768)  # 4d^2 attention + 8d^2 MLP per block
    assert encoder < _parameters(base) < 1.4 * encoder


def test_axis_dims_split_the_width_evenly() -> None:
    assert axis_dims(128) == (44, 42, 42)
    assert axis_dims(96) == (32, 32, 32)
    for width in (6, 8, 10, 64, 384):
        dims = axis_dims(width)
        assert sum(dims) == width
        assert all(d % 2 == 0 for d in dims)
    with pytest.raises(ValueError):
        axis_dims(127)


def test_sincos_pos_embed_shape_range_and_uniqueness() -> None:
    pe = sincos_pos_embed_3d(128, (4, 4, 4))
    assert pe.shape == (64, 128)
    assert pe.dtype == torch.float32
    assert float(pe.abs().max()) <= 1.0
    # every token position gets a distinct embedding
    assert torch.cdist(pe, pe).add(torch.eye(64) * 10).min() > 1e-3
    # the first token (index 0 on every axis) is sin(0)=0 / cos(0)=1 per axis
    first = pe[0]
    assert torch.allclose(first[:22], torch.zeros(22))
    assert torch.allclose(first[22:44], torch.ones(22))
    # time is the fastest axis: token 1 differs from token 0 only in the time share
    diff = (pe[1] - pe[0]).abs()
    assert float(diff[:86].max()) == 0.0
    assert float(diff[86:].max()) > 0.0


def test_patchify_roundtrip_and_layout() -> None:
    x = torch.randn(2, 1, 16, 16, 32)
    tokens = patchify(x, (4, 4, 8))
    assert tokens.shape == (2, 64, 128)
    # token 1 is the second block along time: samples [0:4, 0:4, 8:16]
    assert torch.equal(tokens[0, 1], x[0, 0, 0:4, 0:4, 8:16].reshape(-1))
    assert torch.equal(unpatchify(tokens, (4, 4, 8), (4, 4, 4)), x)


def test_random_masking_keeps_a_quarter_and_restores_order() -> None:
    g = torch.Generator().manual_seed(0)
    tokens = torch.arange(64, dtype=torch.float32).reshape(1, 64, 1).repeat(3, 1, 2)
    visible, mask, ids_restore = random_masking(tokens, 0.75, generator=g)
    assert visible.shape == (3, 16, 2)
    assert mask.shape == (3, 64)
    assert torch.all(mask.sum(dim=1) == 48)
    for b in range(3):
        kept = visible[b, :, 0].long()
        assert torch.all(mask[b, kept] == 0)  # visible tokens are unmasked
        assert sorted(ids_restore[b].tolist()) == list(range(64))
    # different samples get different masks
    assert not torch.equal(mask[0], mask[1])


def test_forward_shapes_loss_and_gradients() -> None:
    torch.manual_seed(0)
    model = MaskedAutoencoder3D(TINY)
    x = torch.randn(2, 1, 16, 16, 32)
    out = model(x)
    assert out.pred.shape == (2, 64, 128)
    assert out.mask.shape == (2, 64)
    assert float(out.mask.mean()) == pytest.approx(0.75)
    assert out.loss.ndim == 0
    assert torch.isfinite(out.loss)
    out.loss.backward()  # type: ignore[no-untyped-call]
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert model.patch_embed.weight.grad is not None
    assert float(model.patch_embed.weight.grad.abs().sum()) > 0


def test_encoder_sees_only_visible_tokens() -> None:
    model = MaskedAutoencoder3D(TINY)
    latent, mask, ids_restore = model.forward_encoder(torch.randn(3, 1, 16, 16, 32), 0.75)
    assert latent.shape == (3, 16, 128)
    assert ids_restore.shape == (3, 64)
    assert mask.shape == (3, 64)


def test_loss_counts_only_masked_tokens() -> None:
    model = MaskedAutoencoder3D(TINY)
    x = torch.randn(2, 1, 16, 16, 32)
    target = patchify(x, TINY.patch_size)
    target = (target - target.mean(-1, keepdim=True)) / torch.sqrt(
        target.var(-1, keepdim=True) + 1e-6
    )
    mask = torch.zeros(2, 64)
    mask[:, :48] = 1
    pred = target.clone()
    pred[:, 48:] += 100.0  # wrong only where the loss must not look
    assert float(model.forward_loss(x, pred, mask)) == pytest.approx(0.0, abs=1e-10)
    pred[:, :48] += 1.0
    assert float(model.forward_loss(x, pred, mask)) == pytest.approx(1.0, rel=1e-5)


def test_reconstruct_undoes_the_per_token_normalisation() -> None:
    model = MaskedAutoencoder3D(TINY)
    x = torch.randn(2, 1, 16, 16, 32) * 3 + 1
    perfect = model.target_tokens(x)  # what a perfect model predicts under norm_pix_loss
    assert perfect.dtype == torch.float32
    assert torch.allclose(model.reconstruct(x, perfect), x, atol=1e-4)
    zeros = model.reconstruct(x, torch.zeros_like(perfect))  # every token its own mean
    tokens = patchify(zeros, TINY.patch_size)
    assert torch.allclose(
        tokens, patchify(x, TINY.patch_size).mean(-1, keepdim=True).expand_as(tokens)
    )


def test_loss_is_float32_for_bf16_predictions() -> None:
    model = MaskedAutoencoder3D(TINY)
    x = torch.randn(1, 1, 16, 16, 32)
    pred = model.target_tokens(x).to(torch.bfloat16)
    mask = torch.ones(1, 64)
    loss = model.forward_loss(x, pred, mask)
    assert loss.dtype == torch.float32
    assert float(loss) < 1e-3  # only bf16 rounding remains


def test_wrong_input_shape_is_rejected() -> None:
    model = MaskedAutoencoder3D(TINY)
    with pytest.raises(ValueError, match="expected input"):
        model(torch.randn(2, 1, 16, 16, 16))


def test_small_custom_config_builds() -> None:
    cfg = MAEConfig(
        name="micro",
        input_size=(8, 8, 8),
        patch_size=(4, 4, 4),
        embed_dim=12,
        depth=1,
        num_heads=2,
        decoder_embed_dim=6,
        decoder_depth=1,
        decoder_num_heads=1,
        mask_ratio=0.5,
    )
    out = MaskedAutoencoder3D(cfg)(torch.randn(1, 1, 8, 8, 8))
    assert out.pred.shape == (1, 8, 64)
    assert float(out.mask.sum()) == 4
