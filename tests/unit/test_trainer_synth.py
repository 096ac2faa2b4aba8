"""Unit tests of the synthetic volume generator (trainer.synth)."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import zarr

from trainer.earthmodel import EarthModel, dead_trace_mask, ricker
from trainer.stats import volume_stats
from trainer.synth import synth
from trainer.synthspec import SynthError, SynthSpec, parse_shape
from trainer.volume import inspect_volume


def _amplitude(path: Path) -> np.ndarray:
    return np.asarray(zarr.open_group(str(path), mode="r")["amplitude"][...])


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("synth") / "small.mdio"
    spec = SynthSpec(shape=(24, 20, 96), chunks=(8, 8, 32), seed=3, dead_fraction=0.1)
    synth(out, spec)
    return out


def test_parse_shape() -> None:
    assert parse_shape("512x256x1024") == (512, 256, 1024)
    assert parse_shape("4X5x6") == (4, 5, 6)
    for bad in ("4x5", "4x5x0", "axbxc", "4x5x6x7", ""):
        with pytest.raises(SynthError, match="IxXxT"):
            parse_shape(bad)


def test_ricker_wavelet_shape_and_spectrum() -> None:
    w = ricker(25.0, 0.004)
    h = (len(w) - 1) // 2
    assert w[h] == 1.0 and np.allclose(w, w[::-1])  # zero phase, peak 1 at the centre
    assert abs(w.sum()) < 0.05 * np.abs(w).sum()  # (almost) no DC: a band-pass wavelet
    spectrum = np.abs(np.fft.rfft(w, 4096))
    freqs = np.fft.rfftfreq(4096, 0.004)
    assert freqs[np.argmax(spectrum)] == pytest.approx(25.0, abs=0.5)


def test_store_is_mdio_post_stack_layout(small: Path) -> None:
    group = zarr.open_group(str(small), mode="r")
    assert group.attrs["attributes"]["defaultVariableName"] == "amplitude"
    assert group.attrs["name"] == "PostStack3DTime"
    amp = group["amplitude"]
    assert isinstance(amp, zarr.Array)
    assert amp.shape == (24, 20, 96) and amp.chunks == (8, 8, 32)
    assert np.dtype(amp.dtype) == np.float32
    assert amp.metadata.dimension_names == ("inline", "crossline", "time")
    assert np.array_equal(group["inline"][...], np.arange(1, 25))
    assert np.array_equal(group["crossline"][...], np.arange(1, 21))
    assert np.array_equal(group["time"][...], np.arange(0, 384, 4))
    assert group["cdp_x"].shape == (24, 20)
    info = inspect_volume(small)
    assert (info.variable, info.mask_variable) == ("amplitude", "trace_mask")


def test_dead_traces_are_nan_and_masked(small: Path) -> None:
    data = _amplitude(small)
    mask = np.asarray(zarr.open_group(str(small), mode="r")["trace_mask"][...])
    assert np.array_equal(mask, dead_trace_mask(SynthSpec((24, 20, 96), seed=3, dead_fraction=0.1)))
    assert 0.03 < 1 - mask.mean() < 0.2
    assert np.isnan(data[~mask]).all()
    assert np.isfinite(data[mask]).all()


def test_stats_v1_match_the_data(small: Path) -> None:
    data = _amplitude(small).astype(np.float64)
    values = data[np.isfinite(data) & (data != 0)]
    raw = zarr.open_group(str(small), mode="r")["amplitude"].attrs["statsV1"]
    stats = json.loads(raw)
    assert stats["count"] == values.size
    assert stats["sum"] == pytest.approx(values.sum(), rel=1e-9, abs=1e-6)
    assert stats["sumSquares"] == pytest.approx((values**2).sum(), rel=1e-9)
    assert (stats["min"], stats["max"]) == (values.min(), values.max())
    vs = volume_stats(inspect_volume(small), (16, 16, 32))
    assert vs.source == "statsV1" and vs.std == pytest.approx(values.std(), rel=1e-6)


def test_volume_looks_like_seismic(small: Path) -> None:
    data = _amplitude(small)
    mask = np.isfinite(data[:, :, 0])

    # laterally coherent layers: neighbouring traces correlate, distant ones much less
    def corr(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.corrcoef(a, b)[0, 1])

    near = [
        corr(data[i, x], data[i, x + 1])
        for i in range(24)
        for x in range(19)
        if mask[i, x] and mask[i, x + 1]
    ]
    assert np.median(near) > 0.6
    # band-limited around the wavelet's peak frequency (25 Hz at 4 ms)
    live = data[mask]
    spectrum = np.abs(np.fft.rfft(live - live.mean(axis=1, keepdims=True), axis=1)).mean(axis=0)
    freqs = np.fft.rfftfreq(96, 0.004)
    assert 12.0 < freqs[np.argmax(spectrum)] < 40.0
    # an amplitude scale like integer field data
    assert 300 < np.nanstd(data) < 3000


def test_faults_offset_the_layers() -> None:
    spec = SynthSpec(shape=(16, 16, 128), faults=1, noise=0.0, fold_amplitude=0.0, seed=1)
    model = EarthModel(spec)
    il = np.arange(16, dtype=np.float64).repeat(16)
    xl = np.tile(np.arange(16, dtype=np.float64), 16)
    times, coef = model.horizons(il, xl)
    kept = coef != 0
    # a vertical trace through a fault misses (or repeats) the boundaries within one
    # throw of where it crosses the plane; all others it keeps exactly once
    throw = float(model.throw[0])
    window = max(int(np.sum((model.tau0 >= t) & (model.tau0 <= t + throw))) for t in model.tau0)
    assert np.all(np.abs(kept.sum(axis=1) - len(model.tau0)) <= window)
    # without folds a boundary sits at its base time or is thrown down by the fault
    kept_times = times[kept]
    base = np.abs(kept_times[:, None] - model.tau0[None, :]).min(axis=1) < 1e-9
    thrown = np.abs(kept_times[:, None] - (model.tau0 + model.throw[0])[None, :]).min(axis=1)
    assert np.all(base | (thrown < 1e-9))
    assert 0.05 < np.mean(thrown < 1e-9) < 0.95  # the fault cuts through the volume


def test_same_seed_same_volume_whatever_the_chunking(tmp_path: Path) -> None:
    shape = (20, 18, 64)
    synth(tmp_path / "a.mdio", SynthSpec(shape=shape, chunks=(8, 8, 64), seed=9))
    synth(tmp_path / "b.mdio", SynthSpec(shape=shape, chunks=(5, 7, 16), seed=9))
    synth(tmp_path / "c.mdio", SynthSpec(shape=shape, chunks=(8, 8, 64), seed=10))
    a, b, c = (_amplitude(tmp_path / f"{n}.mdio") for n in "abc")
    assert np.array_equal(a, b)
    assert not np.allclose(a, c)


def test_worker_processes_write_the_same_volume(tmp_path: Path) -> None:
    spec = SynthSpec(shape=(16, 16, 32), chunks=(8, 8, 32), seed=4)
    synth(tmp_path / "one.mdio", spec)
    synth(tmp_path / "two.mdio", spec, workers=2)
    assert np.array_equal(_amplitude(tmp_path / "one.mdio"), _amplitude(tmp_path / "two.mdio"))


def test_memory_is_bounded_by_a_chunk_column(tmp_path: Path) -> None:
    chunks = (16, 16, 64)
    synth(tmp_path / "warm.mdio", SynthSpec(shape=(8, 8, 64), chunks=chunks))  # imports
    peaks = []
    for shape in [(32, 32, 256), (96, 96, 256)]:  # 1 MiB and 9 MiB of float32
        tracemalloc.start()
        try:
            synth(tmp_path / f"{shape[0]}.mdio", SynthSpec(shape=shape, chunks=chunks))
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
    assert peaks[1] < 1.5 * peaks[0]  # 9x the volume, about the same peak
    assert peaks[1] < 9 * 2**20


def test_progress_is_reported_per_column(tmp_path: Path) -> None:
    calls: list[tuple[int, int]] = []
    synth(
        tmp_path / "p.mdio",
        SynthSpec(shape=(16, 24, 32), chunks=(8, 8, 32)),
        progress=lambda d, t: calls.append((d, t)),
    )
    assert calls == [(k, 6) for k in range(1, 7)]


def test_bad_specs_and_existing_output_are_one_line_errors(tmp_path: Path, small: Path) -> None:
    with pytest.raises(SynthError, match="output exists"):
        synth(small, SynthSpec(shape=(8, 8, 8)))
    for spec, words in [
        (SynthSpec(shape=(8, 8, 8), dead_fraction=1.0), "dead fraction"),
        (SynthSpec(shape=(8, 8, 8), peak_frequency_hz=200.0), "Nyquist"),
        (SynthSpec(shape=(8, 8, 8), faults=99), "faults"),
        (SynthSpec(shape=(8, 8, 8), chunks=(0, 8, 8)), "chunks"),
    ]:
        with pytest.raises(SynthError, match=words):
            synth(tmp_path / "x.mdio", spec)
    with pytest.raises(SynthError, match="does not exist"):
        synth(tmp_path / "no" / "x.mdio", SynthSpec(shape=(8, 8, 8)))
    assert not (tmp_path / "x.mdio").exists()
    assert [p.name for p in tmp_path.iterdir()] == []
