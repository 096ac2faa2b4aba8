"""The epoch plan: seeded patch corners, sharded over ranks, and the sampler that walks them.

An epoch is a fixed, seeded list of patch corners (:class:`EpochPlan`), so a run
is reproducible and its read order can be computed before it starts
(:mod:`trainer.readorder`). Each rank of a distributed run trains on its own
shard of every epoch's list. Every random stream is derived from the run's seed
(:func:`derive_seed`), one stream per purpose (``STREAM_*``). The DataLoader's
sampler (:class:`EpochSampler`) runs in the training process and hands the
workers patch *corners*, so persistent workers serve every epoch without being
restarted.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from trainer.presets import Shape3
from trainer.volume import BoolArray, DataError, IntArray, VolumeInfo, check_fits, read_live_mask

STREAM_EPOCH = 1
"""Seed-stream tag of the epochs' patch positions (see :func:`derive_seed`)."""


STREAM_STATS = 2
"""Seed-stream tag of the blocks read for a sampled statistics estimate."""


STREAM_MASK = 3
"""Seed-stream tag of the model's token masks (one stream per rank)."""


STREAM_EVAL = 4
"""Seed-stream tag of evaluation patch positions and masks."""


def derive_seed(seed: int, *stream: int) -> int:
    """Derive an independent 63-bit seed for one purpose from the run's seed.

    Uses NumPy's ``SeedSequence`` with ``stream`` as its spawn key, so streams
    (epochs, ranks, statistics, evaluation) never overlap and each is a pure
    function of ``(seed, *stream)``.

    Args:
        seed: The run's seed (any non-negative int).
        *stream: Non-negative ints naming the stream, e.g. ``(STREAM_EPOCH, 3)``.

    Returns:
        An int in ``[0, 2**63)``.
    """
    state = np.random.SeedSequence(seed, spawn_key=stream).generate_state(2, np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


def seeded_rng(seed: int, *stream: int) -> np.random.Generator:
    """A NumPy generator for one stream of the run's seed (see :func:`derive_seed`)."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=stream))


def aligned_starts(size: int, patch: int, chunk: int) -> IntArray:
    """Patch start indices along one axis that keep reads chunk-aligned.

    A patch no longer than a chunk starts where it fits inside one chunk, so it
    decodes exactly one chunk along this axis; a longer patch starts on a chunk
    boundary, so it touches the fewest chunks possible (``ceil(patch / chunk)``).

    Args:
        size: Volume length along the axis (samples, >= ``patch``).
        patch: Patch length along the axis.
        chunk: Chunk length along the axis.

    Returns:
        Sorted int64 start indices; never empty when ``size >= patch``.
    """
    starts = np.arange(size - patch + 1, dtype=np.int64)
    keep = (
        starts // chunk == (starts + patch - 1) // chunk if patch <= chunk else starts % chunk == 0
    )
    out: IntArray = starts[keep]
    return out


class PositionSampler:
    """Draws patch corners uniformly from the eligible positions of a volume.

    A position is eligible when the patch fits, its start is chunk-aligned (if
    ``chunks`` is given, see :func:`aligned_starts`) and, with a live mask, at
    least ``min_live_fraction`` of the traces under its footprint are live
    (computed exactly with a summed-area table over the mask). The eligible
    footprints are found once, in the constructor.

    Args:
        shape: Volume shape (inline, crossline, time).
        patch: Patch shape (inline, crossline, time).
        live_mask: Optional (inline, crossline) boolean live-trace mask.
        min_live_fraction: Minimum live fraction of a patch footprint, in [0, 1].
        chunks: Chunk shape to align patches to, or ``None`` for any start.

    Raises:
        DataError: If the patch does not fit or no footprint has enough live traces.
        ValueError: If ``min_live_fraction`` is outside [0, 1] or a chunk size is < 1.
    """

    def __init__(
        self,
        shape: Shape3,
        patch: Shape3,
        live_mask: BoolArray | None = None,
        min_live_fraction: float = 0.5,
        chunks: Shape3 | None = None,
    ) -> None:
        if any(n < p for n, p in zip(shape, patch, strict=True)):
            raise DataError(
                f"volume {'x'.join(map(str, shape))} is smaller than the "
                f"{'x'.join(map(str, patch))} training patch"
            )
        if not 0.0 <= min_live_fraction <= 1.0:
            raise ValueError(f"min_live_fraction must be in [0, 1], got {min_live_fraction}")
        if chunks is not None and min(chunks) < 1:
            raise ValueError(f"chunk sizes must be >= 1, got {chunks}")
        self.shape = shape
        self.patch = patch
        if chunks is None:
            self.starts = [np.arange(shape[a] - patch[a] + 1, dtype=np.int64) for a in range(3)]
        else:
            self.starts = [aligned_starts(shape[a], patch[a], chunks[a]) for a in range(3)]
        self.eligible: IntArray | None = None
        if live_mask is not None and not bool(live_mask.all()):
            if live_mask.shape != shape[:2]:
                raise ValueError(f"live mask {live_mask.shape} does not match volume {shape[:2]}")
            sat = np.zeros((shape[0] + 1, shape[1] + 1), dtype=np.int64)
            sat[1:, 1:] = np.cumsum(np.cumsum(live_mask.astype(np.int64), axis=0), axis=1)
            pi, px = patch[0], patch[1]
            live = sat[pi:, px:] - sat[:-pi, px:] - sat[pi:, :-px] + sat[:-pi, :-px]
            ok = live[np.ix_(self.starts[0], self.starts[1])] >= min_live_fraction * pi * px
            self.eligible = np.flatnonzero(ok).astype(np.int64)
            if len(self.eligible) == 0:
                raise DataError(
                    f"no {pi}x{px}-trace footprint has {min_live_fraction:.0%} live traces"
                )

    @property
    def footprints(self) -> int:
        """Number of eligible (inline, crossline) patch footprints."""
        if self.eligible is not None:
            return len(self.eligible)
        return len(self.starts[0]) * len(self.starts[1])

    def draw(self, count: int, rng: np.random.Generator) -> IntArray:
        """Draw ``count`` corners.

        Args:
            count: Number of corners (>= 0).
            rng: NumPy generator; equal generator states give equal corners.

        Returns:
            int64 array ``(count, 3)`` of start indices (inline, crossline, time).
        """
        n_xl = len(self.starts[1])
        if self.eligible is None:
            il = self.starts[0][rng.integers(0, len(self.starts[0]), size=count)]
            xl = self.starts[1][rng.integers(0, n_xl, size=count)]
        else:
            pick = self.eligible[rng.integers(0, len(self.eligible), size=count)]
            il = self.starts[0][pick // n_xl]
            xl = self.starts[1][pick % n_xl]
        t = self.starts[2][rng.integers(0, len(self.starts[2]), size=count)]
        return np.stack([il, xl, t], axis=1).astype(np.int64)


def sample_positions(
    shape: Shape3,
    patch: Shape3,
    count: int,
    seed: int,
    live_mask: BoolArray | None = None,
    min_live_fraction: float = 0.5,
    chunks: Shape3 | None = None,
) -> IntArray:
    """Draw patch corner positions uniformly at random (see :class:`PositionSampler`).

    Args:
        shape: Volume shape (inline, crossline, time).
        patch: Patch shape (inline, crossline, time).
        count: Number of positions.
        seed: Seed of the NumPy generator; equal seeds give equal positions.
        live_mask: Optional (inline, crossline) boolean live-trace mask.
        min_live_fraction: Minimum live fraction of a patch footprint, in [0, 1].
        chunks: Chunk shape to align patches to, or ``None``.

    Returns:
        int64 array of shape ``(count, 3)``: start indices (inline, crossline, time).

    Raises:
        DataError: If the patch does not fit, or no position has enough live traces.
    """
    sampler = PositionSampler(shape, patch, live_mask, min_live_fraction, chunks)
    return sampler.draw(count, np.random.default_rng(seed))


@dataclass(frozen=True)
class PlanSpec:
    """Everything that determines a run's patch positions (stored in checkpoints).

    Attributes:
        shape: Volume shape (inline, crossline, time).
        patch: Patch shape.
        epoch_size: Patch positions per epoch, over all ranks.
        batch_size: Patches per optimiser step and rank.
        world_size: Number of ranks.
        seed: The run's seed.
        min_live_fraction: Minimum live fraction of a patch footprint.
        align_chunks: Chunk shape patches are aligned to, or ``None``.
    """

    shape: Shape3
    patch: Shape3
    epoch_size: int
    batch_size: int
    world_size: int
    seed: int
    min_live_fraction: float = 0.5
    align_chunks: Shape3 | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form (lists for tuples)."""
        d = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


class EpochPlan:
    """The fixed, seeded patch positions of every epoch, and their split over ranks.

    Epoch ``e`` is ``epoch_size`` corners drawn with the seed stream
    ``(seed, STREAM_EPOCH, e)``: a pure function of the spec, so a run is
    reproducible and its read order is known before it starts. Rank ``r`` of
    ``world_size`` trains on ``positions(e)[r::world_size]``, cut to
    ``per_rank`` corners (a whole number of batches); the ranks' shards are
    disjoint. Global step ``s`` (1-based) reads batch ``(s-1) % steps_per_epoch``
    of epoch ``(s-1) // steps_per_epoch``.

    Args:
        spec: What determines the positions.
        live_mask: The volume's live-trace mask, or ``None``.

    Raises:
        DataError: If no position is eligible.
        ValueError: If an epoch holds less than one batch per rank.
    """

    def __init__(self, spec: PlanSpec, live_mask: BoolArray | None = None) -> None:
        if spec.world_size < 1 or spec.batch_size < 1:
            raise ValueError(f"world size and batch size must be >= 1: {spec}")
        self.per_rank = spec.epoch_size // (spec.world_size * spec.batch_size) * spec.batch_size
        if self.per_rank < 1:
            raise ValueError(
                f"epoch size {spec.epoch_size} is smaller than one batch of "
                f"{spec.batch_size} on each of {spec.world_size} ranks"
            )
        self.spec = spec
        self.sampler = PositionSampler(
            spec.shape, spec.patch, live_mask, spec.min_live_fraction, spec.align_chunks
        )
        self._cache: tuple[int, IntArray] | None = None

    @property
    def steps_per_epoch(self) -> int:
        """Optimiser steps in one epoch."""
        return self.per_rank // self.spec.batch_size

    def positions(self, epoch: int) -> IntArray:
        """All corners of an epoch, over all ranks, in order.

        Args:
            epoch: Epoch number, 0-based.

        Returns:
            int64 array ``(epoch_size, 3)``.
        """
        if self._cache is None or self._cache[0] != epoch:
            rng = seeded_rng(self.spec.seed, STREAM_EPOCH, epoch)
            self._cache = (epoch, self.sampler.draw(self.spec.epoch_size, rng))
        return self._cache[1]

    def shard(self, epoch: int, rank: int = 0) -> IntArray:
        """The corners rank ``rank`` reads in epoch ``epoch``, in read order.

        Args:
            epoch: Epoch number, 0-based.
            rank: Rank in ``[0, world_size)``.

        Returns:
            int64 array ``(per_rank, 3)``.

        Raises:
            ValueError: If ``rank`` is out of range.
        """
        if not 0 <= rank < self.spec.world_size:
            raise ValueError(f"rank {rank} outside [0, {self.spec.world_size})")
        return self.positions(epoch)[rank :: self.spec.world_size][: self.per_rank]

    def locate(self, step: int) -> tuple[int, int]:
        """Where a global step's batch lies in the plan.

        Args:
            step: Global optimiser step, 1-based.

        Returns:
            ``(epoch, offset)``: the epoch and the index of the batch's first
            corner in :meth:`shard`.
        """
        epoch, batch = divmod(step - 1, self.steps_per_epoch)
        return epoch, batch * self.spec.batch_size


class EpochSampler(Sampler[tuple[int, int, int]]):
    """DataLoader sampler yielding one rank's corners of the current epoch.

    It runs in the training process, so the DataLoader's persistent workers
    serve every epoch: call :meth:`set_epoch` before each ``iter(loader)``.

    Args:
        plan: The run's epoch plan.
        rank: This process's rank.
    """

    def __init__(self, plan: EpochPlan, rank: int = 0) -> None:
        self.plan = plan
        self.rank = rank
        self.epoch = 0
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Select the epoch to serve and the first corner (to resume mid-epoch).

        Args:
            epoch: Epoch number, 0-based.
            start: Index of the first corner of the shard to yield.
        """
        self.epoch = epoch
        self.start = start

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        """Yield ``(inline, crossline, time)`` corners in read order."""
        for row in self.plan.shard(self.epoch, self.rank)[self.start :].tolist():
            yield (row[0], row[1], row[2])

    def __len__(self) -> int:
        """Number of corners left in the epoch."""
        return self.plan.per_rank - self.start


def build_plan(
    info: VolumeInfo,
    patch: Shape3,
    *,
    epoch_size: int,
    batch_size: int,
    seed: int,
    world_size: int = 1,
    min_live_fraction: float = 0.5,
    chunk_aligned: bool = False,
) -> EpochPlan:
    """Build the epoch plan of a run on a volume (reads the live mask).

    Args:
        info: The volume.
        patch: Patch shape.
        epoch_size: Patch positions per epoch, over all ranks.
        batch_size: Patches per step and rank.
        seed: The run's seed.
        world_size: Number of ranks.
        min_live_fraction: Minimum live fraction of a patch footprint.
        chunk_aligned: Align patches to the amplitude's chunks.

    Returns:
        The plan.

    Raises:
        DataError: If the patch does not fit or no position is eligible.
        ValueError: If an epoch holds less than one batch per rank.
    """
    check_fits(info, patch)
    spec = PlanSpec(
        shape=info.shape,
        patch=patch,
        epoch_size=epoch_size,
        batch_size=batch_size,
        world_size=world_size,
        seed=seed,
        min_live_fraction=min_live_fraction,
        align_chunks=info.chunks if chunk_aligned else None,
    )
    return EpochPlan(spec, read_live_mask(info))


def positions_digest(positions: IntArray | Sequence[Sequence[int]]) -> str:
    """SHA-256 of a sequence of corners (int64, C order): compares read orders.

    Args:
        positions: Corners ``(N, 3)``.

    Returns:
        Hex digest.
    """
    arr = np.ascontiguousarray(np.asarray(positions, dtype=np.int64).reshape(-1, 3))
    return hashlib.sha256(arr.astype("<i8").tobytes()).hexdigest()
