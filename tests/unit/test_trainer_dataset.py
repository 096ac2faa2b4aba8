"""Unit tests of the Zarr patch dataset, the epoch plan and read order (trainer.dataset)."""

from __future__ import annotations

import json
import os
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from torch.utils.data import DataLoader

from trainer.dataset import PatchDataset, worker_init
from trainer.plan import (
    EpochPlan,
    EpochSampler,
    PlanSpec,
    PositionSampler,
    aligned_starts,
    build_plan,
    derive_seed,
    positions_digest,
    sample_positions,
)
from trainer.readorder import chunks_touched, epoch_read_order, planned_chunk_keys
from trainer.stats import VolumeStats, estimate_stats, normalise, volume_stats
from trainer.volume import (
    DataError,
    check_fits,
    inspect_volume,
    locate_variables,
    open_store,
    read_live_mask,
)

PATCH = (16, 16, 32)
SHAPE = (20, 24, 48)
CHUNKS = (8, 8, 16)
MEAN, STD = 5.0, 100.0


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under root with its size and mtime (to prove nothing is written)."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            st = (Path(dirpath) / name).stat()
            out[str(Path(dirpath) / name)] = (st.st_size, st.st_mtime_ns)
    return out


def _write_volume(path: Path, data: np.ndarray, mask: np.ndarray, chunks: tuple[int, ...]) -> None:
    group = zarr.open_group(str(path), mode="w")
    group.attrs["attributes"] = {"defaultVariableName": "amplitude"}
    amp = group.create_array("amplitude", shape=data.shape, chunks=chunks, dtype="float32")
    amp[...] = data
    tm = group.create_array("trace_mask", shape=mask.shape, chunks=mask.shape, dtype="bool")
    tm[...] = mask


@pytest.fixture()
def volume(tmp_path: Path) -> Path:
    """A small MDIO-like store: Gaussian amplitudes, two dead traces (NaN), a trace mask."""
    path = tmp_path / "vol.mdio"
    rng = np.random.default_rng(1)
    data = (MEAN + STD * rng.standard_normal(SHAPE)).astype(np.float32)
    mask = np.ones(SHAPE[:2], dtype=bool)
    mask[3, 4] = mask[10, 11] = False
    data[~mask] = np.nan
    _write_volume(path, data, mask, CHUNKS)
    return path


def _dataset(path: Path, seed: int = 0) -> PatchDataset:
    info = inspect_volume(path)
    return PatchDataset(info, PATCH, volume_stats(info, PATCH, seed))


def _corners(path: Path, seed: int = 0, count: int = 16) -> np.ndarray:
    info = inspect_volume(path)
    return sample_positions(info.shape, PATCH, count, seed, read_live_mask(info))


def test_inspect_finds_amplitude_mask_and_chunks(volume: Path) -> None:
    info = inspect_volume(volume)
    assert info.variable == "amplitude"
    assert info.mask_variable == "trace_mask"
    assert info.shape == SHAPE
    assert info.chunks == info.storage_chunks == CHUNKS
    assert info.dtype == "float32"
    mask = read_live_mask(info)
    assert mask is not None and mask.shape == SHAPE[:2] and int((~mask).sum()) == 2


def test_sharded_store_reports_the_shard_as_storage_unit(tmp_path: Path) -> None:
    group = zarr.open_group(str(tmp_path / "sharded.zarr"), mode="w")
    group.create_array(
        "amplitude", shape=(32, 32, 64), chunks=(8, 8, 16), shards=(16, 16, 32), dtype="float32"
    )
    info = inspect_volume(tmp_path / "sharded.zarr")
    assert info.chunks == (8, 8, 16)
    assert info.storage_chunks == (16, 16, 32)


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


def test_derived_seeds_are_stable_and_independent() -> None:
    assert derive_seed(7, 1, 0) == derive_seed(7, 1, 0)
    seeds = {derive_seed(s, stream, k) for s in (0, 1) for stream in (1, 2) for k in (0, 1, 2)}
    assert len(seeds) == 12
    assert all(0 <= v < 2**63 for v in seeds)


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


def test_live_fraction_threshold_is_exact() -> None:
    mask = np.ones((40, 40), dtype=bool)
    mask[:, 20:] = False  # right half dead
    sampler = PositionSampler((40, 40, 64), PATCH, mask, min_live_fraction=0.75)
    pos = sampler.draw(500, np.random.default_rng(0))
    live = np.array([mask[i : i + 16, x : x + 16].mean() for i, x, _ in pos])
    assert live.min() >= 0.75
    # the footprints with exactly 75 % live (starting at crossline 8) are eligible
    assert pos[:, 1].max() == 8
    assert sampler.footprints == 25 * 9


@pytest.mark.parametrize(("size", "patch", "chunk"), [(48, 16, 16), (75, 32, 64), (50, 16, 24)])
def test_aligned_starts_keep_patches_inside_one_chunk(size: int, patch: int, chunk: int) -> None:
    starts = aligned_starts(size, patch, chunk)
    assert len(starts) > 0
    assert np.all(starts // chunk == (starts + patch - 1) // chunk)
    assert np.all(starts + patch <= size)
    # and it keeps every start that does (nothing eligible is thrown away)
    every = np.arange(size - patch + 1)
    assert len(starts) == int(np.sum(every // chunk == (every + patch - 1) // chunk))


def test_aligned_starts_for_patches_longer_than_a_chunk_sit_on_boundaries() -> None:
    starts = aligned_starts(100, 32, 8)
    assert list(starts) == list(range(0, 69, 8))


def test_chunk_aligned_positions_touch_one_chunk_each() -> None:
    free = sample_positions((64, 64, 128), PATCH, 300, 0)
    aligned = sample_positions((64, 64, 128), PATCH, 300, 0, chunks=(32, 32, 64))
    touched = [len(chunks_touched(c, PATCH, (32, 32, 64))) for c in aligned]
    assert touched == [1] * 300
    assert np.mean([len(chunks_touched(c, PATCH, (32, 32, 64))) for c in free]) > 2


def test_sampled_stats_estimate_the_volume_distribution(volume: Path) -> None:
    stats = estimate_stats(inspect_volume(volume), PATCH, seed=0, blocks=16)
    assert stats.source == "sample"
    assert stats.count > 100_000
    assert stats.mean == pytest.approx(MEAN, abs=3.0)
    assert stats.std == pytest.approx(STD, rel=0.05)
    assert (stats.clip, stats.scale) == (3.0, 1.0)


def test_mdio_stats_v1_are_used_exactly(volume: Path) -> None:
    amp = zarr.open_group(str(volume), mode="r+")["amplitude"]
    assert isinstance(amp, zarr.Array)
    values = np.asarray(amp[...], dtype=np.float64)
    values = values[np.isfinite(values) & (values != 0)]
    amp.attrs["statsV1"] = json.dumps(
        {
            "count": int(values.size),
            "sum": float(values.sum()),
            "sumSquares": float((values**2).sum()),
            "min": float(values.min()),
            "max": float(values.max()),
            "histogram": {"counts": [], "binCenters": []},
        }
    )
    stats = volume_stats(inspect_volume(volume), PATCH, clip=2.5, scale=0.4)
    assert stats.source == "statsV1"
    assert stats.count == values.size
    assert stats.mean == pytest.approx(values.mean(), rel=1e-9)
    assert stats.std == pytest.approx(values.std(), rel=1e-9)
    assert (stats.clip, stats.scale) == (2.5, 0.4)
    assert stats.peak_to_peak == pytest.approx(2.0)


def test_unusable_stats_v1_falls_back_to_sampling(volume: Path) -> None:
    amp = zarr.open_group(str(volume), mode="r+")["amplitude"]
    amp.attrs["statsV1"] = json.dumps({"count": 0, "sum": 0.0, "sumSquares": 0.0})
    assert volume_stats(inspect_volume(volume), PATCH).source == "sample"


def test_normalise_zscores_clips_and_scales() -> None:
    stats = VolumeStats(mean=10.0, std=2.0, count=1, clip=3.0, scale=0.5)
    raw = np.array([10.0, 12.0, 4.0, 30.0, -30.0, np.nan], dtype=np.float32)
    out = normalise(raw, stats)
    assert out.dtype == np.float32
    assert out.tolist() == [0.0, 0.5, -1.5, 1.5, -1.5, 0.0]
    assert VolumeStats(1.0, 1.0, 1).peak_to_peak == 6.0


def test_non_positive_clip_or_scale_is_rejected(volume: Path) -> None:
    info = inspect_volume(volume)
    with pytest.raises(ValueError, match="must be > 0"):
        volume_stats(info, PATCH, clip=0.0)
    with pytest.raises(ValueError, match="must be > 0"):
        volume_stats(info, PATCH, scale=-1.0)


def test_items_have_shape_dtype_and_normalisation(volume: Path) -> None:
    ds = _dataset(volume)
    corners = _corners(volume, count=32)
    item, corner = ds[tuple(corners[0])]
    assert isinstance(item, torch.Tensor) and item.shape == (1, *PATCH)
    assert item.dtype == torch.float32
    assert corner.tolist() == corners[0].tolist() and corner.dtype == torch.int64
    batch = torch.stack([ds[c][0] for c in corners.tolist()])
    assert torch.isfinite(batch).all()
    assert float(batch.abs().max()) <= 3.0
    assert float(batch.mean()) == pytest.approx(0.0, abs=0.05)
    assert float(batch.std()) == pytest.approx(1.0, abs=0.1)


def test_items_match_the_stored_samples(volume: Path) -> None:
    ds = _dataset(volume)
    raw = np.asarray(zarr.open_group(str(volume), mode="r")["amplitude"][...])
    for i, x, t in _corners(volume).tolist():
        block = raw[i : i + 16, x : x + 16, t : t + 32]
        expected = np.clip((block - ds.stats.mean) / ds.stats.std, -3, 3)
        got = ds.read_patch((i, x, t))
        live = np.isfinite(block)
        np.testing.assert_allclose(got[live], expected[live], rtol=1e-5, atol=1e-5)
        assert np.all(got[~live] == 0.0)  # dead traces read as zeros, never NaN


def test_patch_outside_the_volume_is_rejected(volume: Path) -> None:
    ds = _dataset(volume)
    for bad in [(5, 0, 0), (0, 9, 0), (0, 0, 17), (-1, 0, 0)]:
        with pytest.raises(ValueError, match="outside"):
            ds.read_patch(bad)
    with pytest.raises(ValueError, match="3 indices"):
        ds[(1, 2)]


def test_dataset_pickles_without_open_handles(volume: Path) -> None:
    ds = _dataset(volume)
    first = ds[(0, 0, 0)][0]  # opens the arrays in this process
    assert ds._amplitude is not None
    clone = pickle.loads(pickle.dumps(ds))
    assert clone._amplitude is None and clone._mask is None
    assert torch.equal(clone[(0, 0, 0)][0], first)  # reopens lazily


def test_reading_never_writes_to_the_store(volume: Path) -> None:
    before = _snapshot(volume)
    ds = _dataset(volume)
    for c in _corners(volume).tolist():
        ds[c]
    assert _snapshot(volume) == before


def _spec(**changes: object) -> PlanSpec:
    base: dict[str, object] = {
        "shape": (40, 40, 96),
        "patch": PATCH,
        "epoch_size": 100,
        "batch_size": 4,
        "world_size": 3,
        "seed": 5,
    }
    base.update(changes)
    return PlanSpec(**base)  # type: ignore[arg-type]


def test_epoch_plan_is_a_pure_function_of_its_spec() -> None:
    a, b = EpochPlan(_spec()), EpochPlan(_spec())
    assert np.array_equal(a.positions(0), b.positions(0))
    assert np.array_equal(a.positions(3), b.positions(3))
    assert not np.array_equal(a.positions(0), a.positions(1))  # a new list every epoch
    assert not np.array_equal(a.positions(0), EpochPlan(_spec(seed=6)).positions(0))
    assert a.positions(0).shape == (100, 3)


def test_epoch_plan_splits_each_epoch_into_disjoint_rank_shards() -> None:
    plan = EpochPlan(_spec())
    assert plan.per_rank == 32  # 100 // (3 ranks * 4) = 8 batches of 4
    assert plan.steps_per_epoch == 8
    shards = [plan.shard(1, r) for r in range(3)]
    assert all(s.shape == (32, 3) for s in shards)
    # rank r holds entries r, r+3, ... of the epoch list: disjoint, together the first 96
    full = plan.positions(1)
    for r, shard in enumerate(shards):
        assert np.array_equal(shard, full[r::3][:32])
    assert sorted(i for r in range(3) for i in range(r, 96, 3)) == list(range(96))
    with pytest.raises(ValueError, match="rank"):
        plan.shard(0, 3)


def test_epoch_plan_locates_global_steps() -> None:
    plan = EpochPlan(_spec())
    assert plan.locate(1) == (0, 0)
    assert plan.locate(8) == (0, 28)
    assert plan.locate(9) == (1, 0)
    assert plan.locate(19) == (2, 8)


def test_epoch_smaller_than_a_batch_per_rank_is_rejected() -> None:
    with pytest.raises(ValueError, match="smaller than one batch"):
        EpochPlan(_spec(epoch_size=11))


def test_sampler_feeds_the_loader_exactly_the_shard(volume: Path) -> None:
    info = inspect_volume(volume)
    plan = build_plan(info, PATCH, epoch_size=24, batch_size=4, seed=1, world_size=2)
    ds = PatchDataset(info, PATCH, volume_stats(info, PATCH))
    sampler = EpochSampler(plan, rank=1)
    loader = DataLoader(ds, batch_size=4, sampler=sampler, drop_last=True)
    for epoch, start in [(0, 0), (1, 0), (1, 8)]:
        sampler.set_epoch(epoch, start)
        corners = torch.cat([c for _, c in loader]).numpy()
        assert np.array_equal(corners, plan.shard(epoch, 1)[start:])
        assert len(sampler) == plan.per_rank - start


def test_planned_keys_are_the_store_files_read_in_order(volume: Path) -> None:
    info = inspect_volume(volume)
    corners = np.array([[0, 0, 0], [4, 8, 16], [0, 0, 0]], dtype=np.int64)
    keys = planned_chunk_keys(info, corners, PATCH)
    assert keys[0] == "trace_mask/c/0/0"
    # (0,0,0): chunks 0-1 x 0-1 x 0-1; (4,8,16): 0-2 x 1-2 x 1-2, of which 0-1 x 1 x 1
    # were read already: 12 - 2 new keys follow the first patch's 8
    first = [f"amplitude/c/{a}/{b}/{c}" for a in (0, 1) for b in (0, 1) for c in (0, 1)]
    assert keys[1:9] == first
    assert len(keys) == 1 + 8 + (12 - 2)
    assert len(set(keys)) == len(keys)
    for key in keys:
        assert (volume / key).is_file(), key
    trace = planned_chunk_keys(info, corners, PATCH, unique=False, include_mask=False)
    assert len(trace) == 8 + 12 + 8
    assert trace[:8] == first and trace[-8:] == first


def test_epoch_read_order_follows_the_rank_shard(volume: Path) -> None:
    info = inspect_volume(volume)
    plan = build_plan(info, PATCH, epoch_size=24, batch_size=4, seed=3, world_size=2)
    expected: list[str] = []
    for corner in plan.shard(2, 1).tolist():
        for idx in chunks_touched(corner, PATCH, CHUNKS):
            key = "amplitude/c/" + "/".join(map(str, idx))
            if key not in expected:
                expected.append(key)
    assert epoch_read_order(plan, info, 2, 1) == ["trace_mask/c/0/0", *expected]


def test_positions_digest_distinguishes_order() -> None:
    a = np.array([[1, 2, 3], [4, 5, 6]])
    assert positions_digest(a) == positions_digest(a.tolist())
    assert positions_digest(a) != positions_digest(a[::-1])


def test_worker_init_seeds_numpy_and_python_from_torch() -> None:
    threads = torch.get_num_threads()
    try:
        _check_worker_init()
    finally:
        torch.set_num_threads(threads)


def _check_worker_init() -> None:
    torch.manual_seed(1234)
    worker_init(0)
    a = (np.random.random(), random.random(), torch.get_num_threads())
    torch.manual_seed(1234)
    worker_init(0)
    assert (np.random.random(), random.random(), torch.get_num_threads()) == a
    assert a[2] == 1
    torch.manual_seed(1235)
    worker_init(1)
    assert np.random.random() != a[0]
