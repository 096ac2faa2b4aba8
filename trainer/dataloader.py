"""The DataLoader a run reads through: one construction for ``fit`` and ``load``.

Batches of ``batch_size`` corners from the :class:`~trainer.plan.EpochSampler`
(``drop_last``), read by ``workers`` persistent worker processes started with
``spawn`` or ``forkserver`` (:func:`trainer.dataset.worker_init` gives each one
thread and its seed), collated by PyTorch's default collation. ``fit``
(:class:`trainer.train.Trainer`) trains on what it yields; the loader-only mode
(:mod:`trainer.loadonly`) only times it, so both measure the same loader. What both
read is built here too (:func:`build_dataset`: the volume, its statistics, the plan).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from trainer.dataset import PatchDataset, worker_init
from trainer.options import FitError, FitOptions
from trainer.plan import EpochPlan, EpochSampler, build_plan
from trainer.presets import MAEConfig
from trainer.stats import volume_stats
from trainer.volume import VolumeInfo, check_fits, inspect_volume

STREAM_LOADER = 5
"""Seed-stream tag of the DataLoader's generator (see :func:`trainer.plan.derive_seed`)."""


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


def build_dataset(
    opts: FitOptions, config: MAEConfig, batch_size: int, world_size: int = 1
) -> tuple[VolumeInfo, PatchDataset, EpochPlan]:
    """Inspect the store, take its statistics and build the run's epoch plan.

    Args:
        opts: Run options (data path, seed, epoch size, sampling options).
        config: Model preset (patch shape).
        batch_size: Patches per step and rank.
        world_size: Number of ranks.

    Returns:
        The volume description, the dataset and the plan.

    Raises:
        DataError: If the store cannot be used (see :mod:`trainer.volume`).
        FitError: If an epoch is smaller than one batch on every rank.
    """
    info = inspect_volume(opts.data, opts.storage_options)
    check_fits(info, config.input_size)
    stats = volume_stats(info, config.input_size, opts.seed, opts.clip, opts.scale)
    try:
        plan = build_plan(
            info,
            config.input_size,
            epoch_size=opts.epoch_size,
            batch_size=batch_size,
            seed=opts.seed,
            world_size=world_size,
            min_live_fraction=opts.min_live_fraction,
            chunk_aligned=opts.chunk_aligned,
        )
    except ValueError as exc:
        raise FitError(f"--epoch-size: {exc}") from None
    return info, PatchDataset(info, config.input_size, stats), plan
