"""Random 3D patches from an MDIO / Zarr seismic volume, and the epoch plan that orders them.

The trainer reads a *path*, nothing more: a local directory, the same directory
seen through a Strata FUSE mount, or an object-store URL read through fsspec
(:mod:`trainer.volume`). The store is opened read-only with
``zarr.open_group(path, mode="r")``; nothing is ever written under it.

Process model: the parent process inspects the store
(:func:`trainer.volume.inspect_volume`), takes the normalisation statistics
(:func:`trainer.stats.volume_stats`: MDIO's ``statsV1`` when present, else a
sampled estimate) and builds the :class:`trainer.plan.EpochPlan`. An epoch is a
fixed, seeded list of patch corners, so a run is reproducible and its read order
(:func:`trainer.readorder.planned_chunk_keys`,
:func:`trainer.readorder.epoch_read_order`) can be computed before it starts.
Each rank of a distributed run trains on its own shard of every epoch's list.

:class:`PatchDataset` keeps only plain values (path, names, shapes,
statistics), so it pickles cheaply into ``spawn``/``forkserver`` DataLoader
workers; each worker opens the Zarr arrays lazily on its first read. The
DataLoader's sampler (:class:`trainer.plan.EpochSampler`) runs in the training
process and hands the workers patch *corners*, so persistent workers serve every
epoch without being restarted.

Modules: :mod:`trainer.volume` (inspection, trace mask), :mod:`trainer.stats`
(normalisation), :mod:`trainer.plan` (seeds, sampler, epoch plan),
:mod:`trainer.readorder` (chunk keys for hints) and this one (the patch dataset
and its workers).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import zarr
from torch.utils.data import Dataset

from trainer.presets import Shape3
from trainer.stats import VolumeStats, normalise
from trainer.volume import MASK_CACHE_TRACES, BoolArray, FloatArray, VolumeInfo, open_group


def _corner(key: Any) -> tuple[int, int, int]:
    values = [int(v) for v in key]
    if len(values) != 3:
        raise ValueError(f"a patch corner has 3 indices, got {key!r}")
    return (values[0], values[1], values[2])


class PatchDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Normalised 3D patches addressed by their corner.

    ``dataset[(i, x, t)]`` is the patch whose first sample is ``(i, x, t)``, as
    ``(patch, corner)``: a float32 tensor ``(1, I, X, T)`` (channel, inline,
    crossline, time) normalised with :func:`normalise`, dead traces and
    non-finite samples 0, and the corner as an int64 tensor ``(3,)`` (so the
    training loop knows exactly which data it trained on). The corners come
    from an :class:`EpochSampler`.

    The Zarr arrays are opened lazily in the process that first reads an item
    (each DataLoader worker opens its own) and are dropped when the dataset is
    pickled. A live mask of up to :data:`MASK_CACHE_TRACES` traces is read whole
    at that point, so a patch costs one amplitude read.

    Args:
        info: The volume (from :func:`inspect_volume`).
        patch: Patch shape (inline, crossline, time).
        stats: Normalisation statistics (from :func:`volume_stats`).
    """

    def __init__(self, info: VolumeInfo, patch: Shape3, stats: VolumeStats) -> None:
        self.info = info
        self.patch = patch
        self.stats = stats
        self._upper = np.asarray(info.shape) - np.asarray(patch)
        self._amplitude: zarr.Array[Any] | None = None
        self._mask: zarr.Array[Any] | BoolArray | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Pickle without the open Zarr handles (workers reopen them)."""
        state = self.__dict__.copy()
        state["_amplitude"] = None
        state["_mask"] = None
        return state

    def _open(self) -> tuple[zarr.Array[Any], zarr.Array[Any] | BoolArray | None]:
        if self._amplitude is None:
            group = open_group(self.info.path, self.info.storage_options)
            amp = group[self.info.variable]
            assert isinstance(amp, zarr.Array)
            if self.info.mask_variable is not None:
                mask = group[self.info.mask_variable]
                assert isinstance(mask, zarr.Array)
                small = self.info.shape[0] * self.info.shape[1] <= MASK_CACHE_TRACES
                self._mask = np.asarray(mask[...], dtype=np.bool_) if small else mask
            self._amplitude = amp
        return self._amplitude, self._mask

    def read_patch(self, corner: Sequence[int]) -> FloatArray:
        """Read and normalise one patch.

        Args:
            corner: First sample (inline, crossline, time) of the patch.

        Returns:
            float32 array of shape ``patch``.

        Raises:
            ValueError: If the patch would extend outside the volume.
        """
        i, x, t = _corner(corner)
        if min(i, x, t) < 0 or (np.asarray((i, x, t)) > self._upper).any():
            raise ValueError(f"patch at {(i, x, t)} falls outside the volume {self.info.shape}")
        amp, mask = self._open()
        pi, px, pt = self.patch
        out = normalise(np.asarray(amp[i : i + pi, x : x + px, t : t + pt]), self.stats)
        if mask is not None:
            live = np.asarray(mask[i : i + pi, x : x + px], dtype=np.bool_)
            out[~live] = 0.0
        return out

    def __getitem__(self, corner: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(patch (1, I, X, T) float32, corner (3,) int64)``."""
        c = _corner(corner)
        patch = torch.from_numpy(self.read_patch(c)).unsqueeze(0)
        return patch, torch.tensor(c, dtype=torch.int64)


def worker_init(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: one intra-op thread and a per-worker seed.

    Workers only read and normalise patches; letting each one start a full
    thread pool would oversubscribe the cores the training step needs. The
    DataLoader seeds torch in each worker with ``base_seed + worker_id`` (the
    base drawn from the loader's seeded generator); NumPy's and Python's global
    generators are seeded from it too, so any randomness a worker uses is
    distinct per worker and reproducible per run.

    Args:
        worker_id: Index of the worker.
    """
    del worker_id  # already folded into torch.initial_seed() by the DataLoader
    torch.set_num_threads(1)
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)
