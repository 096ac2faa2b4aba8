"""Random 3D patches from an MDIO / Zarr seismic volume.

The trainer reads a *path*, nothing more: a local directory, or the same
directory seen through a Strata FUSE mount. The store is opened read-only with
``zarr.open_group(path, mode="r")``; nothing is ever written under it.

Process model: the parent process inspects the store (:func:`inspect_volume`),
estimates normalisation statistics once (:func:`estimate_stats`) and draws the
epoch's patch positions (:func:`sample_positions`). :class:`PatchDataset` keeps
only plain values (path, names, shapes, positions, statistics), so it pickles
cheaply into ``spawn``/``forkserver`` DataLoader workers; each worker opens the
Zarr arrays lazily on its first ``__getitem__``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zarr
from torch.utils.data import Dataset

from trainer.presets import Shape3

FloatArray = np.ndarray[Any, np.dtype[np.float32]]
BoolArray = np.ndarray[Any, np.dtype[np.bool_]]
IntArray = np.ndarray[Any, np.dtype[np.int64]]

_FALLBACK_VARIABLES = ("amplitude", "seismic", "data")
_MASK_VARIABLE = "trace_mask"
MASK_CACHE_TRACES = 16 * 1024 * 1024
"""Live masks up to this many traces (16 MiB of bools) are read once per process;
larger ones are read per patch."""


class DataError(Exception):
    """The data path cannot be used for training; the message is one line."""


@dataclass(frozen=True)
class VolumeInfo:
    """Where the amplitudes live inside a store, and their layout.

    Attributes:
        path: Store path as given (a directory).
        variable: Name of the 3D amplitude array inside the group.
        mask_variable: Name of the 2D boolean live-trace mask, or ``None``.
        shape: Amplitude shape (inline, crossline, time) in samples.
        chunks: Amplitude chunk shape.
        dtype: Amplitude dtype name.
    """

    path: str
    variable: str
    mask_variable: str | None
    shape: Shape3
    chunks: Shape3
    dtype: str


@dataclass(frozen=True)
class VolumeStats:
    """Normalisation statistics of a volume.

    Patches are normalised as ``clip((x - mean) / std, -clip, clip)``.

    Attributes:
        mean: Mean amplitude over the sampled live samples (data units).
        std: Standard deviation over the sampled live samples (data units, > 0).
        count: Number of finite samples the estimate used.
        clip: Clip level in standard deviations.
    """

    mean: float
    std: float
    count: int
    clip: float = 3.0


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
    s, c = arr.shape, arr.chunks
    return VolumeInfo(
        path=str(path),
        variable=name,
        mask_variable=mask,
        shape=(int(s[0]), int(s[1]), int(s[2])),
        chunks=(int(c[0]), int(c[1]), int(c[2])),
        dtype=str(np.dtype(arr.dtype)),
    )


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


def sample_positions(
    shape: Shape3,
    patch: Shape3,
    count: int,
    seed: int,
    live_mask: BoolArray | None = None,
    min_live_fraction: float = 0.5,
) -> IntArray:
    """Draw patch corner positions uniformly at random.

    With a live mask, only positions whose patch footprint has at least
    ``min_live_fraction`` live traces are eligible (computed exactly with a
    summed-area table over the mask).

    Args:
        shape: Volume shape (inline, crossline, time).
        patch: Patch shape (inline, crossline, time).
        count: Number of positions.
        seed: Seed of the NumPy generator; equal seeds give equal positions.
        live_mask: Optional (inline, crossline) boolean live-trace mask.
        min_live_fraction: Minimum live fraction of a patch footprint, in [0, 1].

    Returns:
        int64 array of shape ``(count, 3)``: start indices (inline, crossline, time).

    Raises:
        DataError: If the patch does not fit, or no position has enough live traces.
    """
    if any(n < p for n, p in zip(shape, patch, strict=True)):
        raise DataError(
            f"volume {'x'.join(map(str, shape))} is smaller than the "
            f"{'x'.join(map(str, patch))} training patch"
        )
    rng = np.random.default_rng(seed)
    n_il, n_xl, n_t = (shape[i] - patch[i] + 1 for i in range(3))
    if live_mask is None or bool(live_mask.all()):
        il = rng.integers(0, n_il, size=count)
        xl = rng.integers(0, n_xl, size=count)
    else:
        sat = np.zeros((shape[0] + 1, shape[1] + 1), dtype=np.int64)
        sat[1:, 1:] = np.cumsum(np.cumsum(live_mask.astype(np.int64), axis=0), axis=1)
        pi, px = patch[0], patch[1]
        live = sat[pi:, px:] - sat[:-pi, px:] - sat[pi:, :-px] + sat[:-pi, :-px]
        ok = np.argwhere(live >= min_live_fraction * pi * px)
        if len(ok) == 0:
            raise DataError(f"no {pi}x{px}-trace footprint has {min_live_fraction:.0%} live traces")
        pick = ok[rng.integers(0, len(ok), size=count)]
        il, xl = pick[:, 0], pick[:, 1]
    t = rng.integers(0, n_t, size=count)
    return np.stack([il, xl, t], axis=1).astype(np.int64)


def estimate_stats(
    info: VolumeInfo,
    patch: Shape3,
    seed: int = 0,
    blocks: int = 32,
    clip: float = 3.0,
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

    Returns:
        The statistics; ``std`` is 1.0 for a constant volume.

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
    return VolumeStats(mean=float(mean), std=std, count=count, clip=clip)


class PatchDataset(Dataset[torch.Tensor]):
    """Normalised 3D patches at a fixed, seeded list of positions (one epoch).

    Item ``k`` is the patch whose corner is ``positions[k]``, as a float32 tensor
    of shape ``(1, I, X, T)`` (channel, inline, crossline, time), normalised by
    the volume statistics and clipped; dead traces and non-finite samples are 0.

    The Zarr arrays are opened lazily in the process that first reads an item
    (each DataLoader worker opens its own) and are dropped when the dataset is
    pickled. A live mask of up to :data:`MASK_CACHE_TRACES` traces is read whole
    at that point, so a patch costs one amplitude read.

    Args:
        info: The volume (from :func:`inspect_volume`).
        patch: Patch shape (inline, crossline, time).
        stats: Normalisation statistics (from :func:`estimate_stats`).
        positions: ``(N, 3)`` int array of patch corners (from :func:`sample_positions`).

    Raises:
        ValueError: If ``positions`` has the wrong shape or a patch falls outside
            the volume.
    """

    def __init__(
        self, info: VolumeInfo, patch: Shape3, stats: VolumeStats, positions: IntArray
    ) -> None:
        pos = np.asarray(positions, dtype=np.int64)
        if pos.ndim != 2 or pos.shape[1] != 3:
            raise ValueError(f"positions must have shape (N, 3), got {pos.shape}")
        upper = np.asarray(info.shape) - np.asarray(patch)
        if len(pos) and (pos.min() < 0 or (pos > upper).any()):
            raise ValueError("a patch position falls outside the volume")
        self.info = info
        self.patch = patch
        self.stats = stats
        self.positions = pos
        self._amplitude: zarr.Array[Any] | None = None
        self._mask: zarr.Array[Any] | BoolArray | None = None

    def __len__(self) -> int:
        """Number of patches in one epoch."""
        return len(self.positions)

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

    def read_patch(self, index: int) -> FloatArray:
        """Read and normalise one patch.

        Args:
            index: Item index in ``[0, len(self))``.

        Returns:
            float32 array of shape ``patch``.
        """
        amp, mask = self._open()
        i, x, t = (int(v) for v in self.positions[index])
        pi, px, pt = self.patch
        raw = np.asarray(amp[i : i + pi, x : x + px, t : t + pt])
        out = (raw.astype(np.float32) - np.float32(self.stats.mean)) / np.float32(self.stats.std)
        np.clip(out, -self.stats.clip, self.stats.clip, out=out)
        out[~np.isfinite(out)] = 0.0
        if mask is not None:
            live = np.asarray(mask[i : i + pi, x : x + px], dtype=np.bool_)
            out[~live] = 0.0
        return out

    def __getitem__(self, index: int) -> torch.Tensor:
        """Return patch ``index`` as a ``(1, I, X, T)`` float32 tensor."""
        return torch.from_numpy(self.read_patch(index)).unsqueeze(0)


def worker_init(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: one intra-op thread per worker process.

    Workers only read and normalise patches; letting each one start a full
    thread pool would oversubscribe the cores the training step needs.

    Args:
        worker_id: Index of the worker (unused).
    """
    del worker_id
    torch.set_num_threads(1)
