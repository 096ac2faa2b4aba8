"""Random 3D patches from an MDIO / Zarr seismic volume, and the epoch plan that orders them.

The trainer reads a *path*, nothing more: a local directory, or the same
directory seen through a Strata FUSE mount. The store is opened read-only with
``zarr.open_group(path, mode="r")``; nothing is ever written under it.

Process model: the parent process inspects the store (:func:`inspect_volume`),
takes the normalisation statistics (:func:`volume_stats`: MDIO's ``statsV1``
when present, else a sampled estimate) and builds the :class:`EpochPlan`. An
epoch is a fixed, seeded list of patch corners, so a run is reproducible and
its read order (:func:`planned_chunk_keys`, :func:`epoch_read_order`) can be
computed before it starts. Each rank of a distributed run trains on its own
shard of every epoch's list.

:class:`PatchDataset` keeps only plain values (path, names, shapes,
statistics), so it pickles cheaply into ``spawn``/``forkserver`` DataLoader
workers; each worker opens the Zarr arrays lazily on its first read. The
DataLoader's sampler (:class:`EpochSampler`) runs in the training process and
hands the workers patch *corners*, so persistent workers serve every epoch
without being restarted.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zarr
from torch.utils.data import Dataset, Sampler

from trainer.presets import Shape3

FloatArray = np.ndarray[Any, np.dtype[np.float32]]
BoolArray = np.ndarray[Any, np.dtype[np.bool_]]
IntArray = np.ndarray[Any, np.dtype[np.int64]]

_FALLBACK_VARIABLES = ("amplitude", "seismic", "data")
_MASK_VARIABLE = "trace_mask"
MASK_CACHE_TRACES = 16 * 1024 * 1024
"""Live masks up to this many traces (16 MiB of bools) are read once per process;
larger ones are read per patch."""

DEFAULT_CLIP = 3.0
"""Default clip level of normalised amplitudes, in standard deviations."""

STREAM_EPOCH = 1
"""Seed-stream tag of the epochs' patch positions (see :func:`derive_seed`)."""
STREAM_STATS = 2
"""Seed-stream tag of the blocks read for a sampled statistics estimate."""
STREAM_MASK = 3
"""Seed-stream tag of the model's token masks (one stream per rank)."""
STREAM_EVAL = 4
"""Seed-stream tag of evaluation patch positions and masks."""


class DataError(Exception):
    """The data path cannot be used for training; the message is one line."""


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


def _rng(seed: int, *stream: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=stream))


@dataclass(frozen=True)
class VolumeInfo:
    """Where the amplitudes live inside a store, and their layout.

    Attributes:
        path: Store path as given (a directory).
        variable: Name of the 3D amplitude array inside the group.
        mask_variable: Name of the 2D boolean live-trace mask, or ``None``.
        shape: Amplitude shape (inline, crossline, time) in samples.
        chunks: Amplitude (inner) chunk shape: the unit Zarr decodes.
        storage_chunks: Shape of one stored object: the shard shape of a
            sharded array, else ``chunks``.
        dtype: Amplitude dtype name.
        dims: The amplitude's dimension names (e.g. ``("inline", "crossline",
            "time")`` for MDIO), or ``()`` when the store does not name them.
    """

    path: str
    variable: str
    mask_variable: str | None
    shape: Shape3
    chunks: Shape3
    storage_chunks: Shape3
    dtype: str
    dims: tuple[str, ...] = ()


@dataclass(frozen=True)
class VolumeStats:
    """Normalisation statistics of a volume.

    Patches are normalised as ``clip((x - mean) / std, -clip, clip) * scale``:
    a z-score, clipped at ``clip`` standard deviations, then scaled. The default
    ``scale=1`` keeps unit-variance z-scores (what the patch embedding's
    initialisation expects; measured to learn faster on F3 than ``[-1, 1]``);
    ``scale = 1 / clip`` maps to ``[-1, 1]``.

    Attributes:
        mean: Mean amplitude (data units).
        std: Standard deviation (data units, > 0).
        count: Number of samples behind the estimate.
        clip: Clip level in standard deviations (> 0).
        scale: Factor applied after clipping (> 0).
        source: ``"statsV1"`` (MDIO's whole-volume statistics) or ``"sample"``
            (estimated from random blocks).
    """

    mean: float
    std: float
    count: int
    clip: float = DEFAULT_CLIP
    scale: float = 1.0
    source: str = "sample"

    @property
    def peak_to_peak(self) -> float:
        """Range of normalised values, ``2 * clip * scale`` (the PSNR peak)."""
        return 2.0 * self.clip * self.scale


def open_store(path: str | Path) -> zarr.Group:
    """Open a Zarr (MDIO) group read-only.

    Args:
        path: Directory of the store.

    Returns:
        The root group, opened with ``mode="r"``.

    Raises:
        DataError: If the path does not exist or is not a Zarr group.
    """
    p = Path(path)
    if not p.exists():
        raise DataError(f"data path not found: {p}")
    if not p.is_dir():
        raise DataError(f"not a Zarr/MDIO store (not a directory): {p}")
    try:
        return zarr.open_group(str(p), mode="r")
    except Exception as exc:  # zarr raises several types for "no group here"
        raise DataError(f"not a Zarr/MDIO store: {p} ({type(exc).__name__})") from exc


def _is_amplitude_array(node: Any) -> bool:
    return (
        isinstance(node, zarr.Array) and len(node.shape) == 3 and np.dtype(node.dtype).kind in "fiu"
    )


def locate_variables(group: zarr.Group) -> tuple[str, str | None]:
    """Find the amplitude array and the optional trace mask in a group.

    The amplitude is, in order of preference: MDIO v1's
    ``attributes.defaultVariableName`` (``"amplitude"`` for the post-stack
    templates), one of ``amplitude``/``seismic``/``data``, or the only 3D numeric
    array in the group. The trace mask is MDIO's ``trace_mask`` when it is a
    boolean array matching the amplitude's first two dimensions.

    Args:
        group: An open Zarr group.

    Returns:
        ``(amplitude_name, mask_name_or_None)``.

    Raises:
        DataError: If no suitable 3D amplitude array is found.
    """
    members = dict(group.members())
    candidates: list[str] = []
    attrs = group.attrs.get("attributes")
    if isinstance(attrs, dict) and isinstance(attrs.get("defaultVariableName"), str):
        candidates.append(attrs["defaultVariableName"])
    candidates.extend(_FALLBACK_VARIABLES)
    name = next((c for c in candidates if c in members and _is_amplitude_array(members[c])), None)
    if name is None:
        arrays3d = sorted(k for k, v in members.items() if _is_amplitude_array(v))
        if len(arrays3d) != 1:
            found = ", ".join(arrays3d) if arrays3d else "none"
            raise DataError(f"no 3D amplitude array in the store (3D numeric arrays: {found})")
        name = arrays3d[0]
    amp = members[name]
    assert isinstance(amp, zarr.Array)
    mask = members.get(_MASK_VARIABLE)
    mask_name: str | None = None
    if (
        isinstance(mask, zarr.Array)
        and np.dtype(mask.dtype) == np.bool_
        and tuple(mask.shape) == tuple(amp.shape[:2])
    ):
        mask_name = _MASK_VARIABLE
    return name, mask_name


def _shape3(values: Sequence[int]) -> Shape3:
    return (int(values[0]), int(values[1]), int(values[2]))


def inspect_volume(path: str | Path) -> VolumeInfo:
    """Describe the amplitude volume of a store.

    Args:
        path: Directory of a Zarr/MDIO store.

    Returns:
        Names, shape, chunks and dtype of the amplitude variable.

    Raises:
        DataError: If the path is not a store or holds no 3D amplitude array.
    """
    group = open_store(path)
    name, mask = locate_variables(group)
    arr = group[name]
    assert isinstance(arr, zarr.Array)
    shards = arr.shards
    return VolumeInfo(
        path=str(path),
        variable=name,
        mask_variable=mask,
        shape=_shape3(arr.shape),
        chunks=_shape3(arr.chunks),
        storage_chunks=_shape3(shards if shards is not None else arr.chunks),
        dtype=str(np.dtype(arr.dtype)),
        dims=_dimension_names(arr),
    )


def _dimension_names(arr: zarr.Array[Any]) -> tuple[str, ...]:
    """Zarr v3 ``dimension_names``, or Xarray's v2 ``_ARRAY_DIMENSIONS`` attribute."""
    names = getattr(arr.metadata, "dimension_names", None)
    if names is None:
        names = arr.attrs.get("_ARRAY_DIMENSIONS")
    if isinstance(names, list | tuple) and all(isinstance(n, str) for n in names):
        return tuple(str(n) for n in names)
    return ()


def check_fits(info: VolumeInfo, patch: Shape3) -> None:
    """Check that at least one patch fits inside the volume.

    Args:
        info: The volume.
        patch: Patch shape (inline, crossline, time).

    Raises:
        DataError: If the volume is smaller than the patch on any axis.
    """
    if any(n < p for n, p in zip(info.shape, patch, strict=True)):
        vol = "x".join(map(str, info.shape))
        pat = "x".join(map(str, patch))
        raise DataError(f"volume {vol} is smaller than the {pat} training patch")


def read_live_mask(info: VolumeInfo) -> BoolArray | None:
    """Read the whole 2D live-trace mask, if the store has one.

    Args:
        info: The volume.

    Returns:
        Boolean array (inline, crossline), ``True`` for live traces, or ``None``.
    """
    if info.mask_variable is None:
        return None
    arr = open_store(info.path)[info.mask_variable]
    assert isinstance(arr, zarr.Array)
    return np.asarray(arr[...], dtype=np.bool_)


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


def _stats_from_mdio(arr: zarr.Array[Any], clip: float, scale: float) -> VolumeStats | None:
    """MDIO's ``statsV1`` attribute as :class:`VolumeStats`, or ``None`` if absent/unusable."""
    raw = arr.attrs.get("statsV1")
    try:
        s: Any = json.loads(raw) if isinstance(raw, str) else raw
        count = int(s["count"])
        total, total_sq = float(s["sum"]), float(s["sumSquares"])
    except (TypeError, ValueError, KeyError):
        return None
    if count <= 0 or not np.isfinite(total) or not np.isfinite(total_sq):
        return None
    mean = total / count
    std = float(np.sqrt(max(total_sq / count - mean * mean, 0.0)))
    if not np.isfinite(std) or std <= 1e-12 * max(1.0, abs(mean)):
        return None
    return VolumeStats(mean, std, count, clip, scale, source="statsV1")


def estimate_stats(
    info: VolumeInfo,
    patch: Shape3,
    seed: int = 0,
    blocks: int = 32,
    clip: float = DEFAULT_CLIP,
    scale: float = 1.0,
) -> VolumeStats:
    """Estimate the volume's amplitude mean and standard deviation from a sample.

    Reads ``blocks`` random patch-sized blocks (never the whole volume, which may
    be far larger than memory or only reachable over a slow mount), ignoring dead
    traces and non-finite samples. Computed once, in the parent process.

    Args:
        info: The volume.
        patch: Block shape to read (inline, crossline, time).
        seed: Seed for the block positions.
        blocks: Number of blocks to read.
        clip: Clip level (in standard deviations) stored in the result.
        scale: Post-clip scale stored in the result.

    Returns:
        The statistics (``source="sample"``); ``std`` is 1.0 for a constant volume.

    Raises:
        DataError: If the sample holds no finite live value.
    """
    group = open_store(info.path)
    arr = group[info.variable]
    assert isinstance(arr, zarr.Array)
    mask = read_live_mask(info)
    positions = sample_positions(info.shape, patch, blocks, seed, mask)
    total, total_sq, count = 0.0, 0.0, 0
    for i, x, t in positions.tolist():
        block = np.asarray(arr[i : i + patch[0], x : x + patch[1], t : t + patch[2]])
        block = block.astype(np.float64)
        keep = np.isfinite(block)
        if mask is not None:
            keep &= mask[i : i + patch[0], x : x + patch[1], None]
        vals = block[keep]
        total += float(vals.sum())
        total_sq += float(np.square(vals).sum())
        count += int(vals.size)
    if count == 0:
        raise DataError(f"no finite live amplitude found in {info.path}")
    mean = total / count
    var = max(total_sq / count - mean * mean, 0.0)
    std = float(np.sqrt(var))
    if not np.isfinite(std) or std <= 1e-12 * max(1.0, abs(mean)):
        std = 1.0
    _check_clip_scale(clip, scale)
    return VolumeStats(mean=float(mean), std=std, count=count, clip=clip, scale=scale)


def _check_clip_scale(clip: float, scale: float) -> None:
    if not (clip > 0 and scale > 0):
        raise ValueError(f"clip ({clip}) and scale ({scale}) must be > 0")


def volume_stats(
    info: VolumeInfo,
    patch: Shape3,
    seed: int = 0,
    clip: float = DEFAULT_CLIP,
    scale: float = 1.0,
) -> VolumeStats:
    """The volume's normalisation statistics, exact when the store has them.

    MDIO writes whole-volume statistics into the amplitude variable's
    ``statsV1`` attribute while it converts (``count`` of non-zero live samples,
    ``sum``, ``sumSquares``); ``strata-train synth`` writes the same. These give
    the mean and standard deviation exactly (MDIO's convention: over the
    non-zero samples) without reading a single chunk. Stores without them get
    :func:`estimate_stats`.

    Args:
        info: The volume.
        patch: Block shape for the sampled fallback.
        seed: The run's seed (the fallback samples its own stream of it).
        clip: Clip level in standard deviations.
        scale: Post-clip scale.

    Returns:
        The statistics, with ``source`` saying where they came from.

    Raises:
        DataError: If the fallback finds no finite live value.
        ValueError: If ``clip`` or ``scale`` is not positive.
    """
    _check_clip_scale(clip, scale)
    arr = open_store(info.path)[info.variable]
    assert isinstance(arr, zarr.Array)
    stats = _stats_from_mdio(arr, clip, scale)
    if stats is not None:
        return stats
    return estimate_stats(
        info, patch, seed=derive_seed(seed, STREAM_STATS) % 2**32, clip=clip, scale=scale
    )


def normalise(raw: np.ndarray[Any, Any], stats: VolumeStats) -> FloatArray:
    """Normalise raw amplitudes: z-score, clip, scale; non-finite samples become 0.

    Args:
        raw: Amplitudes of any shape and numeric dtype (data units).
        stats: The volume's statistics.

    Returns:
        float32 array of the same shape, values in ``[-clip*scale, clip*scale]``.
    """
    out = (raw.astype(np.float32) - np.float32(stats.mean)) / np.float32(stats.std)
    np.clip(out, -stats.clip, stats.clip, out=out)
    out *= np.float32(stats.scale)
    out[~np.isfinite(out)] = 0.0
    return out


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
            group = zarr.open_group(self.info.path, mode="r")
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
            rng = _rng(self.spec.seed, STREAM_EPOCH, epoch)
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
    group = open_store(info.path)
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
) -> list[str]:
    """The store keys one rank reads in one epoch, in order (for prefetch hints).

    Args:
        plan: The run's plan (from :func:`build_plan`).
        info: The volume the plan was built for.
        epoch: Epoch number, 0-based.
        rank: Rank whose shard to list.
        unique: First touch only (see :func:`planned_chunk_keys`).

    Returns:
        Store-relative keys; the trace mask's first.

    Raises:
        ValueError: If ``rank`` is out of range.
        DataError: If the store cannot be opened.
    """
    return planned_chunk_keys(info, plan.shard(epoch, rank), plan.spec.patch, unique=unique)


def positions_digest(positions: IntArray | Sequence[Sequence[int]]) -> str:
    """SHA-256 of a sequence of corners (int64, C order): compares read orders.

    Args:
        positions: Corners ``(N, 3)``.

    Returns:
        Hex digest.
    """
    arr = np.ascontiguousarray(np.asarray(positions, dtype=np.int64).reshape(-1, 3))
    return hashlib.sha256(arr.astype("<i8").tobytes()).hexdigest()


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
