"""The volume a run trains on: where its amplitudes and live-trace mask are in the store.

The trainer reads a *path*, nothing more: a local directory, the same directory
seen through a Strata FUSE mount, or an object-store URL (``s3://bucket/f3.mdio``,
``gs://...``, any URL fsspec has a filesystem for), so one command runs direct or
through a mount. The store is opened read-only with ``zarr.open_group(path,
mode="r")`` (for a URL, through fsspec with the run's storage options; endpoint and
credentials otherwise come from the filesystem's usual environment, e.g. s3fs's
``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``); nothing is
ever written under it. :func:`data_path` reads a ``--data`` argument,
:func:`parse_storage_options` the ``--storage-option KEY=VALUE`` flags,
:func:`inspect_volume` finds the amplitude array and its trace mask, and
:func:`read_live_mask` reads the mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from trainer.location import StorageOptions, is_url
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
        path: Store path as given (a directory, or an fsspec URL).
        variable: Name of the 3D amplitude array inside the group.
        mask_variable: Name of the 2D boolean live-trace mask, or ``None``.
        shape: Amplitude shape (inline, crossline, time) in samples.
        chunks: Amplitude (inner) chunk shape: the unit Zarr decodes.
        storage_chunks: Shape of one stored object: the shard shape of a
            sharded array, else ``chunks``.
        dtype: Amplitude dtype name.
        dims: The amplitude's dimension names (e.g. ``("inline", "crossline",
            "time")`` for MDIO), or ``()`` when the store does not name them.
        storage_options: fsspec options a URL ``path`` is opened with (every reader,
            DataLoader workers included); may hold credentials, so it is neither
            printed nor written to checkpoints and summaries.
    """

    path: str
    variable: str
    mask_variable: str | None
    shape: Shape3
    chunks: Shape3
    storage_chunks: Shape3
    dtype: str
    dims: tuple[str, ...] = ()
    storage_options: StorageOptions = field(default_factory=dict, repr=False)

    def public(self) -> dict[str, Any]:
        """The description without its storage options (for checkpoints and summaries)."""
        return {k: v for k, v in asdict(self).items() if k != "storage_options"}


def open_group(path: str | Path, storage_options: StorageOptions | None = None) -> zarr.Group:
    """Open a store's root group read-only without checking the path first (workers).

    Args:
        path: Directory or fsspec URL of the store.
        storage_options: fsspec options of a URL (ignored for a local path).

    Returns:
        The root group, opened with ``mode="r"``.
    """
    if is_url(path):
        return zarr.open_group(str(path), mode="r", storage_options=dict(storage_options or {}))
    return zarr.open_group(str(path), mode="r")


def _check_url(url: str, storage_options: StorageOptions) -> None:
    import fsspec  # type: ignore[import-untyped]

    try:
        fs, root = fsspec.core.url_to_fs(url, **storage_options)
        found = fs.exists(root)
    except (ImportError, ValueError) as exc:  # unknown protocol, or its package missing
        raise DataError(f"cannot open {url}: {exc}") from exc
    except Exception as exc:  # credentials, endpoint, network: the filesystem's own types
        raise DataError(f"cannot read {url}: {type(exc).__name__}: {exc}") from exc
    if not found:
        raise DataError(f"data path not found: {url}")


def open_store(path: str | Path, storage_options: StorageOptions | None = None) -> zarr.Group:
    """Open a Zarr (MDIO) group read-only.

    Args:
        path: Directory of the store, or an fsspec URL (``s3://bucket/f3.mdio``).
        storage_options: fsspec options of a URL (ignored for a local path).

    Returns:
        The root group, opened with ``mode="r"``.

    Raises:
        DataError: If the path does not exist, cannot be reached, or is not a Zarr group.
    """
    if is_url(path):
        shown = str(path)
        _check_url(shown, storage_options or {})
    else:
        p = Path(path)
        shown = str(p)
        if not p.exists():
            raise DataError(f"data path not found: {p}")
        if not p.is_dir():
            raise DataError(f"not a Zarr/MDIO store (not a directory): {p}")
    try:
        return open_group(path, storage_options)
    except Exception as exc:  # zarr raises several types for "no group here"
        raise DataError(f"not a Zarr/MDIO store: {shown} ({type(exc).__name__})") from exc


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


def inspect_volume(path: str | Path, storage_options: StorageOptions | None = None) -> VolumeInfo:
    """Describe the amplitude volume of a store.

    Args:
        path: Directory or fsspec URL of a Zarr/MDIO store.
        storage_options: fsspec options of a URL (ignored for a local path).

    Returns:
        Names, shape, chunks and dtype of the amplitude variable.

    Raises:
        DataError: If the path is not a store or holds no 3D amplitude array.
    """
    options = dict(storage_options or {}) if is_url(path) else {}
    group = open_store(path, options)
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
        storage_options=options,
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
    arr = open_store(info.path, info.storage_options)[info.mask_variable]
    assert isinstance(arr, zarr.Array)
    return np.asarray(arr[...], dtype=np.bool_)
