"""Checkpoints: save and load, every rank's RNG state, and whether a run may resume one.

A checkpoint (``OUT/checkpoint.pt``, written atomically, never under the data
path) holds the model, optimiser, scheduler, step and every rank's RNG states;
``--resume`` continues from one exactly: on CPU, N steps straight and N/2 +
resume + N/2 give bit-identical parameters. It holds only tensors and plain
values, so it loads with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from trainer.options import FitError

CHECKPOINT_NAME = "checkpoint.pt"
"""File name of the checkpoint inside the output directory."""
CHECKPOINT_FORMAT = 1
"""Format number written in every checkpoint; others are refused."""


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


def rng_state(mask_gen: torch.Generator, device: torch.device) -> dict[str, Any]:
    """This process's RNG states (torch, CUDA, NumPy, Python, the mask generator), picklable
    with ``weights_only``."""
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


def set_rng_state(state: dict[str, Any], mask_gen: torch.Generator, device: torch.device) -> None:
    """Restore the RNG states :func:`rng_state` took."""
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


def check_resumable(ckpt: dict[str, Any], expected: dict[str, Any], path: Path) -> None:
    """Refuse a checkpoint whose run identity differs from this run's.

    Args:
        ckpt: The loaded checkpoint.
        expected: This run's identity (preset, plan, schedule), key by key.
        path: The checkpoint's path (for the message).

    Raises:
        FitError: Naming the first differing key (and sub-key).
    """
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


def atomic_save(obj: Any, path: Path) -> None:
    """``torch.save`` to a temporary file, then rename it over ``path``."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)
