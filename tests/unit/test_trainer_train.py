"""Unit tests of the training loop's helpers (trainer.train): schedule, devices, ranks."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from trainer.checkpoint import params_digest
from trainer.distributed import (
    DistContext,
    autocast,
    default_threads,
    dist_context_from_env,
    select_device,
)
from trainer.model import MaskedAutoencoder3D
from trainer.options import FitError, check_out_dir
from trainer.presets import PRESETS
from trainer.schedule import WarmupCosine, lr_at, param_groups


def test_lr_schedule_warms_up_then_decays() -> None:
    assert lr_at(1, 100, 1e-3, 10) == pytest.approx(1e-4)
    assert lr_at(10, 100, 1e-3, 10) == pytest.approx(1e-3)
    assert lr_at(100, 100, 1e-3, 10) == pytest.approx(1e-4)
    assert lr_at(55, 100, 1e-3, 10) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))  # half-way
    lrs = [lr_at(s, 100, 1e-3, 10) for s in range(10, 101)]
    assert all(a >= b for a, b in itertools.pairwise(lrs))
    assert lr_at(100, 100, 1.0, 10, floor=0.0) == pytest.approx(0.0)


def test_lambda_scheduler_follows_lr_at() -> None:
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([p], lr=2e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, WarmupCosine(50, 5))
    seen = []
    for _ in range(50):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([lr_at(s, 50, 2e-3, 5) for s in range(1, 51)])
    state = sched.state_dict()
    assert state["last_epoch"] == 50
    assert state["lr_lambdas"] == [{"total": 50, "warmup": 5, "floor": 0.1}]


def test_out_dir_inside_data_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "d.mdio"
    data.mkdir()
    check_out_dir(data, tmp_path / "out")
    for bad in (data, data / "out", data / "a" / ".." / "b"):
        with pytest.raises(FitError, match="inside the data path"):
            check_out_dir(data, bad)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(FitError, match="not a directory"):
        check_out_dir(data, tmp_path / "afile")


def test_default_threads_leave_cores_to_workers() -> None:
    assert default_threads(0, cpus=2) == 2
    assert default_threads(2, cpus=2) == 1
    assert default_threads(4, cpus=16) == 12
    assert default_threads(16, cpus=16) == 8
    assert default_threads(0) >= 1


def test_dist_context_reads_torchrun_variables() -> None:
    assert dist_context_from_env({}) == DistContext(0, 1, 0, 1)
    ctx = dist_context_from_env(
        {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    )
    assert ctx == DistContext(3, 4, 1, 2)
    assert ctx.enabled and not ctx.is_main
    for bad in ({"RANK": "4", "WORLD_SIZE": "4"}, {"WORLD_SIZE": "x"}):
        with pytest.raises(FitError, match="torchrun environment"):
            dist_context_from_env(bad)


def test_device_selection() -> None:
    assert select_device("cpu") == torch.device("cpu")
    with pytest.raises(FitError, match="auto, cpu or cuda"):
        select_device("tpu")
    if not torch.cuda.is_available():
        assert select_device("auto") == torch.device("cpu")
        with pytest.raises(FitError, match="no CUDA device"):
            select_device("cuda")


def test_bf16_autocast_path_gives_a_float32_loss() -> None:
    """The CUDA path's autocast, exercised on the CPU (same code, bf16 matmuls)."""
    torch.manual_seed(0)
    model = MaskedAutoencoder3D(PRESETS["tiny"])
    x = torch.randn(2, 1, 16, 16, 32)
    gen = torch.Generator().manual_seed(0)
    with autocast(torch.device("cpu"), True):
        out = model(x, generator=gen)
    assert out.pred.dtype == torch.bfloat16  # the matmuls really ran in bf16
    assert out.loss.dtype == torch.float32
    out.loss.backward()  # type: ignore[no-untyped-call]
    assert all(p.grad is None or p.grad.dtype == torch.float32 for p in model.parameters())
    gen.manual_seed(0)
    with autocast(torch.device("cpu"), False):
        ref = model(x, generator=gen)
    assert ref.pred.dtype == torch.float32
    assert float(out.loss.detach()) == pytest.approx(float(ref.loss.detach()), rel=0.05)


def test_weight_decay_skips_biases_norms_and_mask_token() -> None:
    model = MaskedAutoencoder3D(PRESETS["tiny"])
    decay, no_decay = param_groups(model, 0.05)
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(p.ndim >= 2 for p in decay["params"])
    skipped = {names[id(p)] for p in no_decay["params"]}
    assert "mask_token" in skipped and "norm.weight" in skipped and "patch_embed.bias" in skipped
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_params_digest_sees_a_single_bit() -> None:
    torch.manual_seed(0)
    a = MaskedAutoencoder3D(PRESETS["tiny"])
    b = MaskedAutoencoder3D(PRESETS["tiny"])
    b.load_state_dict(a.state_dict())
    assert params_digest(a) == params_digest(b)
    with torch.no_grad():
        w = b.decoder_pred.bias
        w.view(torch.int32)[0] ^= 1
    assert params_digest(a) != params_digest(b)
