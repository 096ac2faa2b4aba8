"""Synthetic post-stack seismic volumes of any size (``strata-train synth``): writing one.

What is asked is :mod:`trainer.synthspec`'s; the earth model, wavelet and dead traces
that every amplitude follows from are :mod:`trainer.earthmodel`'s.

Output is an MDIO v1 store (Zarr v3) built from MDIO's own ``PostStack3DTime``
template: ``amplitude`` (float32, inline x crossline x time), ``trace_mask``,
the ``inline``/``crossline``/``time`` dimension coordinates and ``cdp_x``/
``cdp_y``, plus MDIO's ``statsV1`` whole-volume statistics on ``amplitude``,
so ``strata-train fit`` reads it exactly like a converted SEG-Y file.

Streaming: the volume is computed and written one column of chunks (one
inline chunk x one crossline chunk x all samples) at a time, so memory is
bounded by a column, never the volume: a 10 GiB volume needs a few hundred MiB.
Every random draw is a pure function of the seed and the sample's position
(layer model from one seed stream; noise from a counter-based Philox stream
addressed by inline and crossline), so the same seed gives the same
amplitudes whatever the chunk shape or the number of worker processes.
"""

from __future__ import annotations

import concurrent.futures
import json
import math
import multiprocessing
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainer.earthmodel import BoolArray, EarthModel, dead_trace_mask
from trainer.prepare import quiet_progress
from trainer.presets import Shape3
from trainer.synthspec import SynthError, SynthSpec


@dataclass(frozen=True)
class SynthResult:
    """What :func:`synth` wrote.

    Attributes:
        out: Path of the MDIO store.
        shape: Amplitude shape.
        chunks: Amplitude chunk shape.
        nbytes: Uncompressed amplitude size in bytes.
        stored_bytes: Bytes of the amplitude's chunk files on disk.
        live_traces: Traces with data.
        mean: Mean of the non-zero live amplitudes (MDIO ``statsV1`` convention).
        std: Their standard deviation.
        elapsed_s: Wall time, seconds.
    """

    out: Path
    shape: Shape3
    chunks: Shape3
    nbytes: int
    stored_bytes: int
    live_traces: int
    mean: float
    std: float
    elapsed_s: float

    @property
    def mib_per_s(self) -> float:
        """Uncompressed amplitude MiB written per second."""
        return self.nbytes / 2**20 / max(self.elapsed_s, 1e-9)


def _columns(spec: SynthSpec) -> Iterator[tuple[int, int, int, int]]:
    n_il, n_xl, _ = spec.shape
    c_il, c_xl, _ = spec.chunks
    for i0 in range(0, n_il, c_il):
        for x0 in range(0, n_xl, c_xl):
            yield i0, min(i0 + c_il, n_il), x0, min(x0 + c_xl, n_xl)


def _write_column(
    model: EarthModel, live: BoolArray, array_path: str, block: tuple[int, int, int, int]
) -> tuple[int, float, float, float, float]:
    """Compute one column of chunks, write it, return its ``statsV1`` partial sums.

    Statistics follow MDIO's convention (non-zero samples of live traces) and
    are accumulated one inline row at a time in float64, so they cost no more
    memory than a row.
    """
    import zarr

    i0, i1, x0, x1 = block
    data = model.traces(i0, i1, x0, x1)
    alive = live[i0:i1, x0:x1]
    count, total, total_sq, vmin, vmax = 0, 0.0, 0.0, math.inf, -math.inf
    for k in range(i1 - i0):
        row = data[k][alive[k]].astype(np.float64)
        nonzero = row[row != 0]
        if nonzero.size:
            count += int(nonzero.size)
            total += float(nonzero.sum())
            total_sq += float(np.dot(nonzero, nonzero))
            vmin = min(vmin, float(nonzero.min()))
            vmax = max(vmax, float(nonzero.max()))
    data[~alive] = np.nan
    arr = zarr.open_array(array_path, mode="r+")
    arr[i0:i1, x0:x1, :] = data
    return count, total, total_sq, vmin, vmax


def _create_store(path: Path, spec: SynthSpec, live: BoolArray) -> None:
    """Create the MDIO structure (metadata, coordinates, trace mask); amplitudes empty."""
    import zarr

    with quiet_progress(False):
        from mdio import to_mdio
        from mdio.builder.template_registry import get_template
        from mdio.builder.xarray_builder import to_xarray_dataset
        from mdio.converters.segy import _chunk_variable  # pinned multidimio==1.1.3

    template = get_template("PostStack3DTime")
    template.full_chunk_shape = spec.chunks
    dataset = template.build_dataset(name=template.name, sizes=spec.shape)
    _chunk_variable(ds=dataset, target_variable_name="trace_mask")
    for coord in template.coordinate_names:
        _chunk_variable(ds=dataset, target_variable_name=coord)
    to_mdio(to_xarray_dataset(dataset), output_path=str(path), mode="w", compute=False)

    n_il, n_xl, n_t = spec.shape
    group = zarr.open_group(str(path), mode="r+")
    il, xl = np.meshgrid(np.arange(n_il), np.arange(n_xl), indexing="ij")
    values: dict[str, np.ndarray[Any, Any]] = {
        "inline": spec.first_inline + np.arange(n_il, dtype=np.int32),
        "crossline": spec.first_crossline + np.arange(n_xl, dtype=np.int32),
        "time": spec.sample_interval_ms * np.arange(n_t, dtype=np.int32),
        "cdp_x": 600_000.0 + spec.bin_size_m * il,
        "cdp_y": 6_000_000.0 + spec.bin_size_m * xl,
        "trace_mask": live,
    }
    for name, value in values.items():
        arr = group[name]
        assert isinstance(arr, zarr.Array)
        arr[...] = value
    attributes: Any = group.attrs.get("attributes", {})
    group.attrs["attributes"] = {
        **dict(attributes),
        "synthetic": {k: v for k, v in spec.__dict__.items() if k not in ("shape", "chunks")},
    }


def _stored_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def synth(
    out: Path,
    spec: SynthSpec,
    *,
    overwrite: bool = False,
    workers: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> SynthResult:
    """Write a synthetic post-stack volume as an MDIO v1 store.

    The store is written next to ``out`` under a temporary name and renamed
    into place when complete.

    Args:
        out: Output directory, conventionally ``NAME.mdio``.
        spec: What to generate.
        overwrite: Replace ``out`` if it exists.
        workers: Processes computing columns (``spawn``); 1 computes in this process.
        progress: Called with ``(columns_done, columns_total)`` after each column.

    Returns:
        What was written.

    Raises:
        SynthError: On invalid values, an existing output, or a write failure.
    """
    t0 = time.perf_counter()
    spec.validate()
    if workers < 1:
        raise SynthError(f"workers must be >= 1, got {workers}")
    out = Path(out)
    if out.exists() and not overwrite:
        raise SynthError(f"output exists: {out} (use --overwrite to replace it)")
    if out.exists() and not out.is_dir():
        raise SynthError(f"output exists and is not a directory: {out}")
    parent = out.absolute().parent
    if not parent.is_dir():
        raise SynthError(f"output directory does not exist: {parent}")

    tmp = parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        live = dead_trace_mask(spec)
        _create_store(tmp, spec, live)
        model = EarthModel(spec)
        array_path = str(tmp / "amplitude")
        blocks = list(_columns(spec))
        parts: list[tuple[int, float, float, float, float]] = []
        if workers == 1:
            for block in blocks:
                parts.append(_write_column(model, live, array_path, block))
                if progress is not None:
                    progress(len(parts), len(blocks))
        else:
            ctx = multiprocessing.get_context("spawn")
            with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
                futures = [pool.submit(_write_column, model, live, array_path, b) for b in blocks]
                for future in concurrent.futures.as_completed(futures):
                    parts.append(future.result())
                    if progress is not None:
                        progress(len(parts), len(blocks))
        count = sum(p[0] for p in parts)
        total = math.fsum(p[1] for p in parts)
        total_sq = math.fsum(p[2] for p in parts)
        vmin = min((p[3] for p in parts), default=0.0)
        vmax = max((p[4] for p in parts), default=0.0)
        _write_stats(tmp, count, total, total_sq, vmin, vmax)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except SynthError:
        raise
    except Exception as exc:  # zarr, mdio and the OS raise many types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SynthError(f"writing {out} failed: {first}") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    mean = total / count if count else 0.0
    std = math.sqrt(max(total_sq / count - mean * mean, 0.0)) if count else 0.0
    return SynthResult(
        out=out,
        shape=spec.shape,
        chunks=spec.chunks,
        nbytes=4 * spec.shape[0] * spec.shape[1] * spec.shape[2],
        stored_bytes=_stored_bytes(out / "amplitude"),
        live_traces=int(live.sum()),
        mean=mean,
        std=std,
        elapsed_s=time.perf_counter() - t0,
    )


def _write_stats(
    path: Path, count: int, total: float, total_sq: float, vmin: float, vmax: float
) -> None:
    """Store MDIO's ``statsV1`` on the amplitude (same convention: non-zero live samples)."""
    import zarr

    arr = zarr.open_array(str(path / "amplitude"), mode="r+")
    stats = {
        "count": count,
        "sum": total,
        "sumSquares": total_sq,
        "min": vmin if count else 0.0,
        "max": vmax if count else 0.0,
        "histogram": {"counts": [], "binCenters": []},
    }
    arr.attrs["statsV1"] = json.dumps(stats, separators=(",", ":"))
