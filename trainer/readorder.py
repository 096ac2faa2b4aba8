"""The planned read order of a run: which chunk keys each rank reads, in order.

Computed from the epoch plan before training starts, so a run can post it as a
hint to a cache (:mod:`trainer.hints`) without the trainer knowing what the
cache is: the keys are store-relative Zarr chunk keys.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import zarr

from trainer.plan import EpochPlan
from trainer.presets import Shape3
from trainer.volume import IntArray, VolumeInfo, open_store


def chunks_touched(corner: Sequence[int], patch: Shape3, chunks: Shape3) -> list[Shape3]:
    """Chunk grid indices a patch overlaps, in C order.

    Args:
        corner: Patch corner (inline, crossline, time).
        patch: Patch shape.
        chunks: Chunk (or shard) shape.

    Returns:
        Chunk indices ``(ci, cx, ct)``.
    """
    ranges = [
        range(int(c) // k, (int(c) + p - 1) // k + 1)
        for c, p, k in zip(corner, patch, chunks, strict=True)
    ]
    return [(a, b, c) for a in ranges[0] for b in ranges[1] for c in ranges[2]]


def planned_chunk_keys(
    info: VolumeInfo,
    positions: IntArray | Sequence[Sequence[int]],
    patch: Shape3,
    *,
    unique: bool = True,
    include_mask: bool = True,
) -> list[str]:
    """The store keys (files) that reading patches at ``positions`` touches, in order.

    Keys are paths relative to the store root, exactly as the Zarr store names
    its objects (e.g. ``amplitude/c/0/1/2`` for Zarr v3's default encoding;
    the shard's key for a sharded array). This is what a read-through cache
    can be told to prefetch before the reads happen.

    Args:
        info: The volume.
        positions: Patch corners ``(N, 3)`` in read order.
        patch: Patch shape.
        unique: Keep only each key's first touch (prefetch hints); ``False``
            lists one key per chunk read, repeats included (an access trace).
        include_mask: Start with the trace mask's keys (read when a reader
            opens the dataset), if the store has a mask.

    Returns:
        Store-relative keys in the order the trainer reads them.

    Raises:
        DataError: If the store cannot be opened.
    """
    group = open_store(info.path, info.storage_options)
    amp = group[info.variable]
    assert isinstance(amp, zarr.Array)
    keys: list[str] = []
    if include_mask and info.mask_variable is not None:
        mask = group[info.mask_variable]
        assert isinstance(mask, zarr.Array)
        grid = mask.shards if mask.shards is not None else mask.chunks
        counts = [-(-n // k) for n, k in zip(mask.shape, grid, strict=True)]
        for a in range(counts[0]):
            for b in range(counts[1]):
                keys.append(f"{info.mask_variable}/{mask.metadata.encode_chunk_key((a, b))}")
    seen: set[Shape3] = set()
    for corner in np.asarray(positions, dtype=np.int64).tolist():
        for idx in chunks_touched(corner, patch, info.storage_chunks):
            if unique:
                if idx in seen:
                    continue
                seen.add(idx)
            keys.append(f"{info.variable}/{amp.metadata.encode_chunk_key(idx)}")
    return keys


def epoch_read_order(
    plan: EpochPlan,
    info: VolumeInfo,
    epoch: int,
    rank: int = 0,
    *,
    unique: bool = True,
    steps: int | None = None,
) -> list[str]:
    """The store keys one rank reads in one epoch, in order (for prefetch hints).

    Args:
        plan: The run's plan (from :func:`build_plan`).
        info: The volume the plan was built for.
        epoch: Epoch number, 0-based.
        rank: Rank whose shard to list.
        unique: First touch only (see :func:`planned_chunk_keys`).
        steps: Only the epoch's first this many steps (None: all of it); with
            ``unique``, a prefix of the whole epoch's keys.

    Returns:
        Store-relative keys; the trace mask's first.

    Raises:
        ValueError: If ``rank`` is out of range.
        DataError: If the store cannot be opened.
    """
    positions = plan.shard(epoch, rank)
    if steps is not None:
        positions = positions[: max(0, steps) * plan.spec.batch_size]
    return planned_chunk_keys(info, positions, plan.spec.patch, unique=unique)
