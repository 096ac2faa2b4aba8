"""Unit tests of the Zarr patch dataset (trainer.dataset) and training-loop helpers."""

from __future__ import annotations

import itertools
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr

from trainer.dataset import (
    DataError,
    PatchDataset,
    VolumeStats,
    check_fits,
    estimate_stats,
    inspect_volume,
    locate_variables,
    open_store,
    read_live_mask,
    sample_positions,
)
from trainer.train import FitError, check_out_dir, default_threads, lr_at

PATCH = (16, 16, 32)
SHAPE = (20, 24, 48)
MEAN, STD = 5.0, 100.0


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under root with its size and mtime (to prove nothing is written)."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            st = (Path(dirpath) / name).stat()
            out[str(Path(dirpath) / name)] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture()
def volume(tmp_path: Path) -> Path:
    """A small MDIO-like store: Gaussian amplitudes, two dead traces (NaN), a trace mask."""
    path = tmp_path / "vol.mdio"
    group = zarr.open_group(str(path), mode="w")
    group.attrs["attributes"] = {"defaultVariableName": "amplitude"}
    rng = np.random.default_rng(1)
    data = (MEAN + STD * rng.standard_normal(SHAPE)).astype(np.float32)
    mask = np.ones(SHAPE[:2], dtype=bool)
    mask[3, 4] = mask[10, 11] = False
    data[~mask] = np.nan
    amp = group.create_array("amplitude", shape=SHAPE, chunks=(8, 8, 16), dtype="float32")
    amp[...] = data
    tm = group.create_array("trace_mask", shape=SHAPE[:2], chunks=SHAPE[:2], dtype="bool")
    tm[...] = mask
    return path


def _dataset(path: Path, seed: int = 0, count: int = 16) -> PatchDataset:
    info = inspect_volume(path)
    mask = read_live_mask(info)
    stats = estimate_stats(info, PATCH, seed=seed)
    positions = sample_positions(info.shape, PATCH, count, seed, mask)
    return PatchDataset(info, PATCH, stats, positions)


def test_inspect_finds_amplitude_and_mask(volume: Path) -> None:
    info = inspect_volume(volume)
    assert info.variable == "amplitude"
    assert info.mask_variable == "trace_mask"
    assert info.shape == SHAPE
    assert info.chunks == (8, 8, 16)
    assert info.dtype == "float32"
    mask = read_live_mask(info)
    assert mask is not None and mask.shape == SHAPE[:2] and int((~mask).sum()) == 2


def test_locate_falls_back_to_the_only_3d_array(tmp_path: Path) -> None:
    group = zarr.open_group(str(tmp_path / "plain.zarr"), mode="w")
    group.create_array("seismic_cube", shape=(20, 20, 40), dtype="int16")
    group.create_array("inline", shape=(20,), dtype="int32")
    assert locate_variables(group) == ("seismic_cube", None)
    group.create_array("other_cube", shape=(20, 20, 40), dtype="float32")
    with pytest.raises(DataError, match="3D amplitude"):
        locate_variables(group)


def test_missing_and_non_zarr_paths_raise_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not found"):
        open_store(tmp_path / "nope.mdio")
    with pytest.raises(DataError, match="not a Zarr"):
        open_store(tmp_path)  # an empty directory
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(DataError, match="not a Zarr"):
        open_store(tmp_path / "file.txt")


def test_volume_smaller_than_patch_is_rejected(volume: Path) -> None:
    info = inspect_volume(volume)
    check_fits(info, PATCH)
    with pytest.raises(DataError, match="smaller than"):
        check_fits(info, (16, 16, 64))
    with pytest.raises(DataError, match="smaller than"):
        sample_positions(SHAPE, (32, 16, 16), 4, 0)


def test_positions_are_seeded_and_in_bounds() -> None:
    a = sample_positions(SHAPE, PATCH, 200, seed=7)
    b = sample_positions(SHAPE, PATCH, 200, seed=7)
    c = sample_positions(SHAPE, PATCH, 200, seed=8)
    assert a.shape == (200, 3) and a.dtype == np.int64
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    assert a.min() >= 0
    assert np.all(a <= np.array(SHAPE) - np.array(PATCH))
    # every valid start is reachable (uniform draw over the whole range)
    assert set(a[:, 0]) == set(range(SHAPE[0] - PATCH[0] + 1))


def test_positions_avoid_mostly_dead_footprints() -> None:
    mask = np.zeros(SHAPE[:2], dtype=bool)
    mask[:16, :16] = True  # only the corner footprint is fully live
    pos = sample_positions(SHAPE, PATCH, 50, seed=0, live_mask=mask, min_live_fraction=1.0)
    assert np.all(pos[:, :2] == 0)
    with pytest.raises(DataError, match="live traces"):
        sample_positions(SHAPE, PATCH, 5, 0, live_mask=np.zeros(SHAPE[:2], dtype=bool))


def test_stats_estimate_the_volume_distribution(volume: Path) -> None:
    stats = estimate_stats(inspect_volume(volume), PATCH, seed=0, blocks=16)
    assert stats.count > 100_000
    assert stats.mean == pytest.approx(MEAN, abs=3.0)
    assert stats.std == pytest.approx(STD, rel=0.05)
    assert stats.clip == 3.0


def test_items_have_shape_dtype_and_normalisation(volume: Path) -> None:
    ds = _dataset(volume, count=32)
    assert len(ds) == 32
    item = ds[0]
    assert isinstance(item, torch.Tensor)
    assert item.shape == (1, *PATCH)
    assert item.dtype == torch.float32
    batch = torch.stack([ds[i] for i in range(len(ds))])
    assert torch.isfinite(batch).all()
    assert float(batch.abs().max()) <= 3.0
    assert float(batch.mean()) == pytest.approx(0.0, abs=0.05)
    assert float(batch.std()) == pytest.approx(1.0, abs=0.1)


def test_items_match_the_stored_samples(volume: Path) -> None:
    ds = _dataset(volume)
    raw = np.asarray(zarr.open_group(str(volume), mode="r")["amplitude"][...])
    for k in range(len(ds)):
        i, x, t = ds.positions[k]
        block = raw[i : i + 16, x : x + 16, t : t + 32]
        expected = np.clip((block - ds.stats.mean) / ds.stats.std, -3, 3)
        got = ds.read_patch(k)
        live = np.isfinite(block)
        np.testing.assert_allclose(got[live], expected[live], rtol=1e-5, atol=1e-5)
        assert np.all(got[~live] == 0.0)  # dead traces read as zeros, never NaN


def test_dataset_is_deterministic_for_a_seed(volume: Path) -> None:
    a, b, c = _dataset(volume, seed=3), _dataset(volume, seed=3), _dataset(volume, seed=4)
    assert np.array_equal(a.positions, b.positions)
    assert torch.equal(a[5], b[5])
    assert not np.array_equal(a.positions, c.positions)


def test_dataset_pickles_without_open_handles(volume: Path) -> None:
    ds = _dataset(volume)
    first = ds[0]  # opens the arrays in this process
    assert ds._amplitude is not None
    clone = pickle.loads(pickle.dumps(ds))
    assert clone._amplitude is None and clone._mask is None
    assert torch.equal(clone[0], first)  # reopens lazily


def test_reading_never_writes_to_the_store(volume: Path) -> None:
    before = _snapshot(volume)
    ds = _dataset(volume)
    for k in range(len(ds)):
        ds[k]
    assert _snapshot(volume) == before


def test_bad_positions_are_rejected(volume: Path) -> None:
    info = inspect_volume(volume)
    stats = VolumeStats(mean=0.0, std=1.0, count=1)
    with pytest.raises(ValueError, match="shape"):
        PatchDataset(info, PATCH, stats, np.zeros((4, 2), dtype=np.int64))
    with pytest.raises(ValueError, match="outside"):
        PatchDataset(info, PATCH, stats, np.array([[5, 0, 0]]))


def test_lr_schedule_warms_up_then_decays() -> None:
    assert lr_at(1, 100, 1e-3, 10) == pytest.approx(1e-4)
    assert lr_at(10, 100, 1e-3, 10) == pytest.approx(1e-3)
    assert lr_at(100, 100, 1e-3, 10) == pytest.approx(1e-4)
    lrs = [lr_at(s, 100, 1e-3, 10) for s in range(10, 101)]
    assert all(a >= b for a, b in itertools.pairwise(lrs))


def test_out_dir_inside_data_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "d.mdio"
    data.mkdir()
    check_out_dir(data, tmp_path / "out")
    for bad in (data, data / "out", data / "a" / ".." / "b"):
        with pytest.raises(FitError, match="inside the data path"):
            check_out_dir(data, bad)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(FitError, match="not a directory"):
        check_out_dir(data, tmp_path / "afile")


def test_default_threads_leave_cores_to_workers() -> None:
    assert default_threads(0, cpus=2) == 2
    assert default_threads(2, cpus=2) == 1
    assert default_threads(4, cpus=16) == 12
    assert default_threads(16, cpus=16) == 8
    assert default_threads(0) >= 1
