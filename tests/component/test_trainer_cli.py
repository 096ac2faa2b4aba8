"""Component tests of ``strata-train``'s data commands on the real seismic files: prepare,
plan, synth.

``prepare`` runs in subprocesses (``python -m trainer``), as users run it: MDIO's ingest
starts processes with ``spawn``. Every shared SEG-Y file is prepared (or rejected with
one line) here, and the sparse and two-inline files' fits show what training makes of
them; ``plan`` and ``synth`` run in typer's in-process runner. Training, resuming and
evaluating are in ``test_trainer_fit.py``. In-process training uses one torch thread: on
a loaded 2-core machine OpenMP's spinning threads otherwise slow a step down several
times (measured 5x).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr
from typer.testing import CliRunner

from tests.component.trainer_support import (
    assert_one_line_error,
    f3_mdio_fixture,  # noqa: F401  (the f3_mdio fixture)
    run_cli,
)
from trainer.cli import app
from trainer.options import FitOptions
from trainer.prepare import prepare, segy_spec
from trainer.train import fit
from trainer.volume import DataError


def test_prepare_f3_shape_coordinates_and_mask(f3_mdio: Path) -> None:
    group = zarr.open_group(str(f3_mdio), mode="r")
    amp = group["amplitude"]
    assert isinstance(amp, zarr.Array)
    assert amp.shape == (23, 18, 75)
    assert np.dtype(amp.dtype) == np.float32
    assert np.array_equal(group["inline"][...], np.arange(111, 134))
    assert np.array_equal(group["crossline"][...], np.arange(875, 893))
    assert np.array_equal(group["time"][...], np.arange(0, 300, 4))
    mask = np.asarray(group["trace_mask"][...])
    assert mask.shape == (23, 18) and mask.all()
    assert group.attrs["attributes"]["defaultVariableName"] == "amplitude"
    assert not list(f3_mdio.parent.glob(".*partial*"))  # temporary store renamed away


def test_prepare_f3_values_match_the_segy_traces(seismic: Path, f3_mdio: Path) -> None:
    from segy import SegyFile

    segy = SegyFile(str(seismic / "f3.sgy"))
    amp = np.asarray(zarr.open_group(str(f3_mdio), mode="r")["amplitude"][...])
    for k in (0, 137, segy.num_traces - 1):
        trace = segy.trace[k]
        il, xl = int(trace.header["inline"]), int(trace.header["crossline"])
        expected = np.asarray(trace.sample, dtype=np.float32)
        assert expected.shape == (75,) and np.abs(expected).max() > 0
        np.testing.assert_array_equal(amp[il - 111, xl - 875, :], expected)


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("volve10r12-full-z-il10117sub.sgy", ("no 3D geometry", "byte 189", "202 traces")),
        ("test-geometry.sgy", ("4 samples", "at least 32")),
        ("does-not-exist.sgy", ("not found",)),
    ],
)
def test_prepare_rejects_unusable_files_in_one_line(
    seismic: Path, tmp_path: Path, name: str, words: tuple[str, ...]
) -> None:
    out = tmp_path / "x.mdio"
    proc = run_cli("prepare", "--segy", seismic / name, "--out", out)
    assert_one_line_error(proc, *words)
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_prepare_refuses_to_overwrite(seismic: Path, f3_mdio: Path) -> None:
    proc = run_cli("prepare", "--segy", seismic / "f3.sgy", "--out", f3_mdio)
    assert_one_line_error(proc, "exists", "--overwrite")


@pytest.fixture(scope="module")
def withdead_mdio(seismic: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """f3-withdead.sgy (IBM floats, 175 of 414 traces missing), prepared in-process."""
    out = tmp_path_factory.mktemp("withdead") / "f3-withdead.mdio"
    result = prepare(seismic / "f3-withdead.sgy", out)
    assert result.sample_format == "ibm32"
    assert result.live_traces == 239 and result.shape == (23, 18, 75)
    return out


def test_prepare_sparse_ibm_file_keeps_dead_traces_in_the_mask(
    seismic: Path, withdead_mdio: Path, f3_mdio: Path
) -> None:
    from segy import SegyFile

    group = zarr.open_group(str(withdead_mdio), mode="r")
    amp = np.asarray(group["amplitude"][...])
    mask = np.asarray(group["trace_mask"][...])
    assert amp.shape == (23, 18, 75) and int(mask.sum()) == 239
    assert np.isnan(amp[~mask]).all()  # dead traces: NaN, MDIO's fill value
    segy = SegyFile(str(seismic / "f3-withdead.sgy"), spec=segy_spec(189, 193))
    for k in (0, 100, segy.num_traces - 1):
        trace = segy.trace[k]
        il, xl = int(trace.header["inline"]) - 111, int(trace.header["crossline"]) - 875
        assert mask[il, xl]
        np.testing.assert_array_equal(amp[il, xl], np.asarray(trace.sample, dtype=np.float32))
    # the IBM crop holds the int16 original's amplitudes wherever a trace survived
    full = np.asarray(zarr.open_group(str(f3_mdio), mode="r")["amplitude"][...])
    np.testing.assert_allclose(amp[mask], full[mask], rtol=1e-6)


def test_fit_on_the_sparse_file_rejects_mostly_dead_patches(
    withdead_mdio: Path, tmp_path: Path
) -> None:
    mask = np.asarray(zarr.open_group(str(withdead_mdio), mode="r")["trace_mask"][...])
    summary = fit(
        FitOptions(
            threads=1,
            data=withdead_mdio,
            out=tmp_path / "run",
            steps=4,
            workers=0,
            min_live_fraction=0.6,
        ),
        echo=lambda _: None,
    )
    assert np.isfinite(summary["loss_last"])
    from trainer.plan import build_plan
    from trainer.volume import inspect_volume

    info = inspect_volume(withdead_mdio)
    plan = build_plan(
        info, (16, 16, 32), epoch_size=1024, batch_size=8, seed=0, min_live_fraction=0.6
    )
    live = [mask[i : i + 16, x : x + 16].mean() for i, x, _ in plan.positions(0)]
    assert min(live) >= 0.6
    assert plan.sampler.footprints < 8 * 3  # some footprints of the full grid were rejected


def test_prepare_two_inline_file_converts_but_cannot_train(seismic: Path, tmp_path: Path) -> None:
    out = tmp_path / "ebcdic.mdio"
    result = prepare(seismic / "f3-ebcidctest.sgy", out)
    assert result.shape == (2, 100, 463) and result.live_traces == 200
    assert result.inline_range == (105, 106) and result.crossline_range == (300, 399)
    with pytest.raises(DataError, match="2x100x463 is smaller than the 16x16x32"):
        fit(
            FitOptions(threads=1, data=out, out=tmp_path / "run", steps=1, workers=0),
            echo=lambda _: None,
        )


def test_plan_cli_prints_the_epoch_read_order(f3_mdio: Path) -> None:
    from trainer.plan import build_plan
    from trainer.readorder import epoch_read_order
    from trainer.volume import inspect_volume

    result = CliRunner().invoke(app, ["plan", "--data", str(f3_mdio), "--epoch", "1"])
    assert result.exit_code == 0, result.output
    keys = result.stdout.split()
    info = inspect_volume(f3_mdio)
    plan = build_plan(info, (16, 16, 32), epoch_size=1024, batch_size=8, seed=0)
    assert keys == epoch_read_order(plan, info, 1)
    # F3 is one chunk in inline and crossline, two in time; the mask is read first
    assert sorted(keys) == ["amplitude/c/0/0/0", "amplitude/c/0/0/1", "trace_mask/c/0/0"]
    assert keys[0] == "trace_mask/c/0/0"
    assert all((f3_mdio / key).is_file() for key in keys)
    # chunk-aligned patches never reach the second time chunk (11 samples, < 32)
    aligned = CliRunner().invoke(app, ["plan", "--data", str(f3_mdio), "--chunk-aligned"])
    assert aligned.stdout.split() == ["trace_mask/c/0/0", "amplitude/c/0/0/0"]


def test_synth_cli_writes_a_trainable_volume(tmp_path: Path) -> None:
    out = tmp_path / "syn.mdio"
    args = ["synth", "--shape", "20x20x48", "--chunks", "16x16x32", "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--dead-fraction", "0.1"])
    assert result.exit_code == 0, result.output
    assert "20x20x48" in result.stdout and "chunks 16x16x32" in result.stdout
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 2 and "output exists" in again.stderr
    bad = CliRunner().invoke(app, ["synth", "--shape", "20x20", "--out", str(tmp_path / "b")])
    assert bad.exit_code == 2 and bad.stderr.startswith("strata-train: error: shape must")
    summary = fit(
        FitOptions(threads=1, data=out, out=tmp_path / "run", steps=2, workers=0),
        echo=lambda _: None,
    )
    assert summary["volume"]["stats_source"] == "statsV1"
    assert summary["volume"]["trace_mask"] == "trace_mask"
