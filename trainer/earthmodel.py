"""The physics of a synthetic volume: the earth model (:class:`EarthModel`), the wavelet
(:func:`ricker`) and the dead traces (:func:`dead_trace_mask`), each a pure function of
the spec's seed. Writing the volume is :mod:`trainer.synth`'s.

The earth model is a stack of layers whose boundaries are bent by folds and
offset by normal faults; each boundary reflects with the coefficient of the
impedance contrast across it. The reflectivity series of every trace, plus
band-limited noise, is convolved with a zero-phase Ricker wavelet (Ricker
1953, "The form and laws of propagation of seismic wavelets"):
``w(t) = (1 - 2 (pi f t)^2) exp(-(pi f t)^2)`` for peak frequency ``f``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from trainer.synthspec import SynthSpec

FloatArray = np.ndarray[Any, np.dtype[np.float32]]
DoubleArray = np.ndarray[Any, np.dtype[np.float64]]
BoolArray = np.ndarray[Any, np.dtype[np.bool_]]

_FFT_BATCH_ELEMENTS = 2**21
"""Traces x FFT length computed at once (about 32 MiB of complex128 spectra)."""

_STREAM_MODEL = 11
_STREAM_NOISE = 12
_STREAM_DEAD = 13


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
