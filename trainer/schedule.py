"""The optimiser's schedule: AdamW parameter groups, linear warm-up, then cosine decay.

AdamW (Loshchilov & Hutter 2019) with MAE's betas (0.9, 0.95) and no weight decay
on biases, norms and the mask token; the learning rate warms up linearly and then
follows a cosine decay to :data:`LR_FLOOR` of its peak (Loshchilov & Hutter 2017,
"SGDR: Stochastic Gradient Descent with Warm Restarts", without restarts).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

LR_FLOOR = 0.1
"""The cosine schedule ends at this fraction of the peak learning rate."""

ADAM_BETAS = (0.9, 0.95)
"""AdamW's betas, as in MAE."""


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


def make_optimizer(
    model: nn.Module, peak_lr: float, weight_decay: float, total: int, warmup: int
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over :func:`param_groups` and its :class:`WarmupCosine` scheduler.

    Args:
        model: The model (unwrapped).
        peak_lr: Peak learning rate.
        weight_decay: Decay of the matrices.
        total: Total optimiser steps of the run.
        warmup: Warm-up steps.

    Returns:
        The optimiser and the scheduler (step it once per optimiser step).
    """
    optimizer = torch.optim.AdamW(param_groups(model, weight_decay), lr=peak_lr, betas=ADAM_BETAS)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupCosine(total, warmup))
    return optimizer, scheduler
