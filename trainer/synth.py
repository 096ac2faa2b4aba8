"""Synthetic post-stack seismic volumes of any size (``strata-train synth``).

The earth model is a stack of layers whose boundaries are bent by folds and
offset by normal faults; each boundary reflects with the coefficient of the
impedance contrast across it. The reflectivity series of every trace, plus
band-limited noise, is convolved with a zero-phase Ricker wavelet (Ricker
1953, "The form and laws of propagation of seismic wavelets"):
``w(t) = (1 - 2 (pi f t)^2) exp(-(pi f t)^2)`` for peak frequency ``f``.

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

from trainer.prepare import quiet_progress
from trainer.presets import Shape3

FloatArray = np.ndarray[Any, np.dtype[np.float32]]
DoubleArray = np.ndarray[Any, np.dtype[np.float64]]
BoolArray = np.ndarray[Any, np.dtype[np.bool_]]

DEFAULT_CHUNKS: Shape3 = (64, 64, 64)
"""Default amplitude chunk shape: 1 MiB of float32, as ``prepare`` writes."""

MAX_FAULTS = 8
"""Most faults a volume may have (each can double the reflectors per trace)."""

_FFT_BATCH_ELEMENTS = 2**21
"""Traces x FFT length computed at once (about 32 MiB of complex128 spectra)."""

_STREAM_MODEL = 11
_STREAM_NOISE = 12
_STREAM_DEAD = 13


class SynthError(Exception):
    """The synthetic volume cannot be written; the message is one line."""


@dataclass(frozen=True)
class SynthSpec:
    """What to generate.

    Attributes:
        shape: Volume shape (inlines, crosslines, samples per trace).
        chunks: Amplitude chunk shape (inline, crossline, time).
        seed: Seed of everything random (>= 0).
        sample_interval_ms: Time between samples, whole milliseconds.
        peak_frequency_hz: Ricker wavelet peak frequency.
        noise: Noise level: rms of the noise added to the reflectivity relative
            to the reflectivity's rms (0 for none).
        faults: Number of normal faults.
        fold_amplitude: Largest fold displacement, as a fraction of the trace length.
        layer_thickness: Mean layer thickness in samples; ``None`` for
            ``clip(samples / 40, 3, 12)``.
        dead_fraction: Fraction of traces marked dead (NaN, trace mask False).
        first_inline: Number of the first inline.
        first_crossline: Number of the first crossline.
        bin_size_m: Trace spacing for the ``cdp_x``/``cdp_y`` coordinates, metres.
    """

    shape: Shape3
    chunks: Shape3 = DEFAULT_CHUNKS
    seed: int = 0
    sample_interval_ms: int = 4
    peak_frequency_hz: float = 25.0
    noise: float = 0.1
    faults: int = 3
    fold_amplitude: float = 0.08
    layer_thickness: float | None = None
    dead_fraction: float = 0.0
    first_inline: int = 1
    first_crossline: int = 1
    bin_size_m: float = 25.0

    def validate(self) -> None:
        """Check the values.

        Raises:
            SynthError: On a value out of range.
        """
        checks = [
            (
                len(self.shape) == 3 and min(self.shape) >= 1,
                f"shape {self.shape} must be 3 sizes >= 1",
            ),
            (len(self.chunks) == 3 and min(self.chunks) >= 1, f"chunks {self.chunks} must be >= 1"),
            (self.seed >= 0, f"seed must be >= 0, got {self.seed}"),
            (self.sample_interval_ms >= 1, "sample interval must be >= 1 ms"),
            (
                0 < self.peak_frequency_hz < 500.0 / self.sample_interval_ms,
                f"peak frequency {self.peak_frequency_hz} Hz must be in (0, Nyquist "
                f"{500.0 / self.sample_interval_ms:g} Hz)",
            ),
            (self.noise >= 0, f"noise must be >= 0, got {self.noise}"),
            (0 <= self.faults <= MAX_FAULTS, f"faults must be in [0, {MAX_FAULTS}]"),
            (0 <= self.fold_amplitude <= 1, "fold amplitude must be in [0, 1]"),
            (
                self.layer_thickness is None or self.layer_thickness >= 1,
                "layer thickness must be >= 1 sample",
            ),
            (
                0 <= self.dead_fraction < 1,
                f"dead fraction must be in [0, 1), got {self.dead_fraction}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise SynthError(message)


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


def parse_shape(text: str, what: str = "shape") -> Shape3:
    """Parse ``"IxXxT"`` (e.g. ``"512x512x1024"``) into three positive ints.

    Args:
        text: The text.
        what: Name used in the error message.

    Returns:
        The three sizes.

    Raises:
        SynthError: If the text is not three positive integers joined by ``x``.
    """
    parts = text.lower().replace("×", "x").split("x")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if len(values) != 3 or min(values) < 1:
        raise SynthError(f"{what} must look like IxXxT with positive integers, got {text!r}")
    return (values[0], values[1], values[2])


def ricker(peak_hz: float, dt_s: float, half_length: int | None = None) -> DoubleArray:
    """Zero-phase Ricker wavelet sampled at ``dt_s``.

    Args:
        peak_hz: Peak frequency, Hz.
        dt_s: Sample interval, seconds.
        half_length: Samples on each side of the centre; ``None`` for
            ``ceil(1.5 / (peak_hz * dt_s))`` (beyond which it is < 1e-7 of its peak).

    Returns:
        float64 array of ``2 * half_length + 1`` samples, peak 1 at the centre.
    """
    h = math.ceil(1.5 / (peak_hz * dt_s)) if half_length is None else half_length
    t = np.arange(-h, h + 1, dtype=np.float64) * dt_s
    a = (np.pi * peak_hz * t) ** 2
    out: DoubleArray = (1.0 - 2.0 * a) * np.exp(-a)
    return out


class EarthModel:
    """Layers, folds and faults: where each reflector is under each trace.

    Built once from the spec's seed (a few hundred numbers), then evaluated for
    any block of traces; picklable, so worker processes get a copy.

    Args:
        spec: The synthetic volume's spec.
    """

    def __init__(self, spec: SynthSpec) -> None:
        rng = np.random.default_rng(np.random.SeedSequence(spec.seed, spawn_key=(_STREAM_MODEL,)))
        n_il, n_xl, n_t = spec.shape
        self.spec = spec
        self.wavelet = ricker(spec.peak_frequency_hz, spec.sample_interval_ms / 1000.0)
        self.half = (len(self.wavelet) - 1) // 2
        thick = spec.layer_thickness or float(np.clip(n_t / 40.0, 3.0, 12.0))
        fold = spec.fold_amplitude * n_t
        # Folds: three long-wavelength sinusoids in different directions and a dome.
        span = max(n_il, n_xl)
        self.fold_amp = fold * rng.dirichlet(np.ones(4)) * rng.choice([-1.0, 1.0], size=4)
        theta = rng.uniform(0, np.pi, size=3)
        wavelength = rng.uniform(0.6, 2.0, size=3) * span
        self.fold_k = (
            np.stack([np.cos(theta), np.sin(theta)], axis=1) * (2 * np.pi / wavelength)[:, None]
        )
        self.fold_phase = rng.uniform(0, 2 * np.pi, size=3)
        self.dome = (rng.uniform(0, n_il), rng.uniform(0, n_xl), rng.uniform(0.2, 0.5) * span)
        # Normal faults: a vertical offset on the hanging-wall side of a dipping plane.
        self.throw = rng.uniform(0.02, 0.08, size=spec.faults) * n_t
        self.fault_center = np.stack(
            [
                rng.uniform(0.2, 0.8, spec.faults) * n_il,
                rng.uniform(0.2, 0.8, spec.faults) * n_xl,
                rng.uniform(0.2, 0.8, spec.faults) * n_t,
            ],
            axis=1,
        )
        strike = rng.uniform(0, np.pi, size=spec.faults)
        self.fault_normal = np.stack([np.cos(strike), np.sin(strike)], axis=1)
        # Horizontal shift per sample of depth: steep planes dipping either way.
        self.fault_slope = rng.uniform(0.15, 0.6, size=spec.faults) * rng.choice(
            [-1.0, 1.0], size=spec.faults
        )
        # Layer boundaries, covering the window plus everything folds and faults move in.
        margin = 1.5 * fold + float(np.abs(self.throw).sum()) + self.half + 2
        count = math.ceil((n_t + 2 * margin) / thick) + 2
        self.tau0 = np.cumsum(rng.gamma(4.0, thick / 4.0, size=count)) - margin
        # Reflection coefficients from a random walk of log impedance
        # (r = (Z2 - Z1) / (Z2 + Z1) ~ d ln Z / 2), a few boundaries much stronger.
        log_z = np.cumsum(rng.normal(0.0, 0.08, size=count + 1))
        self.refl = np.tanh(np.diff(log_z) / 2.0)
        strong = rng.random(count) < 0.08
        self.refl[strong] *= 4.0
        self.depth_factor = 0.5 + np.clip(self.tau0, 0, n_t) / n_t
        self.refl_rms = float(np.sqrt(np.mean(self.refl**2) / thick))
        # Scale so amplitudes come out in an int16-like range (rms of order 1000).
        self.gain = 1000.0 / (self.refl_rms * float(np.sqrt(np.sum(self.wavelet**2))))

    def horizons(self, il: DoubleArray, xl: DoubleArray) -> tuple[DoubleArray, DoubleArray]:
        """Two-way time (in samples) and reflection coefficient of every reflector under each trace.

        Each fault splits every boundary into a footwall copy, kept where it lies
        on the footwall side of the plane, and a hanging-wall copy moved down by
        the throw, kept where it lies on the hanging-wall side; so reflectors end
        cleanly against the fault plane. Copies no trace keeps are dropped.

        Args:
            il: Inline indices of the traces ``(N,)`` (0-based, float).
            xl: Crossline indices ``(N,)``.

        Returns:
            ``(times, coefficients)``, both ``(N, M)``; a coefficient is 0 where
            that trace does not have the reflector.
        """
        phase = np.outer(il, self.fold_k[:, 0]) + np.outer(xl, self.fold_k[:, 1]) + self.fold_phase
        bend = np.sin(phase) @ self.fold_amp[:3]
        ci, cx, radius = self.dome
        bend += self.fold_amp[3] * np.exp(-((il - ci) ** 2 + (xl - cx) ** 2) / (2 * radius**2))
        tau = self.tau0[None, :] + np.outer(bend, self.depth_factor)
        coef = np.broadcast_to(self.refl, tau.shape)
        for f in range(len(self.throw)):
            ci_f, cx_f, ct_f = self.fault_center[f]
            across = (il - ci_f) * self.fault_normal[f, 0] + (xl - cx_f) * self.fault_normal[f, 1]
            moved = tau + self.throw[f]
            foot = across[:, None] - (tau - ct_f) * self.fault_slope[f] <= 0
            hang = across[:, None] - (moved - ct_f) * self.fault_slope[f] > 0
            tau = np.concatenate([tau, moved], axis=1)
            coef = np.concatenate([coef * foot, coef * hang], axis=1)
            keep = (coef != 0).any(axis=0)
            tau, coef = tau[:, keep], coef[:, keep]
        return tau, coef

    def traces(self, i0: int, i1: int, x0: int, x1: int) -> FloatArray:
        """Amplitudes of the traces ``[i0:i1, x0:x1]``, all samples.

        Args:
            i0: First inline index (0-based).
            i1: End inline index (exclusive).
            x0: First crossline index.
            x1: End crossline index (exclusive).

        Returns:
            float32 ``(i1 - i0, x1 - x0, samples)``.
        """
        n_t = self.spec.shape[2]
        nx = x1 - x0
        nfft = 1 << (n_t + 4 * self.half).bit_length()
        # a few inline rows at a time: the FFT work arrays stay near 32 MiB
        rows = max(1, _FFT_BATCH_ELEMENTS // (nx * nfft))
        out = np.empty((i1 - i0, nx, n_t), dtype=np.float32)
        for a in range(i0, i1, rows):
            b = min(a + rows, i1)
            out[a - i0 : b - i0] = self._rows(a, b, x0, x1, nfft).reshape(b - a, nx, n_t)
        return out

    def _rows(self, i0: int, i1: int, x0: int, x1: int, nfft: int) -> FloatArray:
        """Traces ``[i0:i1, x0:x1]`` as ``(N, samples)`` float32 (see :meth:`traces`)."""
        n_t = self.spec.shape[2]
        h = self.half
        length = n_t + 2 * h  # reflectors within a wavelet of the window reach into it
        il, xl = np.meshgrid(
            np.arange(i0, i1, dtype=np.float64), np.arange(x0, x1, dtype=np.float64), indexing="ij"
        )
        n = il.size
        tau, refl = self.horizons(il.ravel(), xl.ravel())
        tau = tau + h
        inside = (tau >= 0) & (tau < length - 1)
        lo = np.floor(tau[inside]).astype(np.int64)
        frac = tau[inside] - lo
        row = np.nonzero(inside)[0].astype(np.int64) * length
        r = refl[inside]
        flat = np.asarray(
            np.bincount(row + lo, weights=r * (1 - frac), minlength=n * length), np.float64
        )
        flat = flat + np.bincount(row + lo + 1, weights=r * frac, minlength=n * length)
        series = flat.reshape(n, length)
        if self.spec.noise > 0:
            series += self.spec.noise * self.refl_rms * self._noise(i0, i1, x0, x1, length)
        kernel = np.zeros(nfft)
        kernel[: h + 1] = self.wavelet[h:]
        kernel[nfft - h :] = self.wavelet[:h]
        conv = np.fft.irfft(np.fft.rfft(series, nfft, axis=1) * np.fft.rfft(kernel), nfft, axis=1)
        out: FloatArray = (conv[:, h : h + n_t] * self.gain).astype(np.float32)
        return out

    def _noise(self, i0: int, i1: int, x0: int, x1: int, length: int) -> DoubleArray:
        """Standard normal noise, a pure function of (seed, inline, crossline, sample).

        Philox is counter-based: the stream of inline ``i`` starts at counter
        ``(0, i)``; trace ``x`` owns uniforms ``[x * stride, (x + 1) * stride)``,
        ``stride`` a multiple of 4 (one counter step yields four), turned into
        normals with the Box-Muller transform.
        """
        key = np.random.SeedSequence(self.spec.seed, spawn_key=(_STREAM_NOISE,)).generate_state(
            2, np.uint64
        )
        pairs = (length + 1) // 2
        stride = -(-2 * pairs // 4) * 4
        nx = x1 - x0
        out = np.empty((i1 - i0, nx, length))
        for k, i in enumerate(range(i0, i1)):
            gen = np.random.Generator(
                np.random.Philox(key=key, counter=[x0 * stride // 4, i, 0, 0])
            )
            u = gen.random(nx * stride).reshape(nx, stride)[:, : 2 * pairs]
            u1, u2 = 1.0 - u[:, 0::2], u[:, 1::2]  # u1 in (0, 1]
            radius = np.sqrt(-2.0 * np.log(u1))
            normals = np.concatenate(
                [radius * np.cos(2 * np.pi * u2), radius * np.sin(2 * np.pi * u2)], axis=1
            )
            out[k] = normals[:, :length]
        return out.reshape(-1, length)


def dead_trace_mask(spec: SynthSpec) -> BoolArray:
    """The live-trace mask: ``dead_fraction`` of traces dropped at random.

    Args:
        spec: The spec (shape, seed, dead fraction).

    Returns:
        Boolean ``(inlines, crosslines)``, ``True`` where the trace is live.
    """
    rng = np.random.default_rng(np.random.SeedSequence(spec.seed, spawn_key=(_STREAM_DEAD,)))
    live: BoolArray = rng.random(spec.shape[:2]) >= spec.dead_fraction
    return live


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
