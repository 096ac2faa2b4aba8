"""The DataLoader a run reads through: one construction for ``fit`` and ``load``.

Batches of ``batch_size`` corners from the :class:`~trainer.plan.EpochSampler`
(``drop_last``), read by ``workers`` persistent worker processes started with
``spawn`` or ``forkserver`` (:func:`trainer.dataset.worker_init` gives each one
thread and its seed), collated by PyTorch's default collation. ``fit``
(:class:`trainer.train.Trainer`) trains on what it yields; the loader-only mode
(:mod:`trainer.loadonly`) only times it, so both measure the same loader.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from trainer.dataset import worker_init
from trainer.plan import EpochSampler


def make_loader(
    dataset: Dataset[Any],
    sampler: EpochSampler,
    batch_size: int,
    workers: int,
    mp_context: str,
    generator: torch.Generator,
    pin_memory: bool = False,
) -> DataLoader[Any]:
    """The run's DataLoader.

    Args:
        dataset: Items addressed by patch corner (:class:`~trainer.dataset.PatchDataset`).
        sampler: The epoch sampler (call its ``set_epoch`` before each ``iter``).
        batch_size: Corners per batch; a last partial batch is dropped.
        workers: Worker processes; 0 reads in the calling process.
        mp_context: Worker start method, ``"spawn"`` or ``"forkserver"``.
        generator: Seeds the workers (``base_seed + worker_id``).
        pin_memory: Page-lock batches for a CUDA device.

    Returns:
        The loader; its workers start on the first ``iter`` and persist across epochs.
    """
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=True,
        num_workers=workers,
        multiprocessing_context=mp_context if workers > 0 else None,
        persistent_workers=workers > 0,
        worker_init_fn=worker_init if workers > 0 else None,
        pin_memory=pin_memory,
        generator=generator,
    )
