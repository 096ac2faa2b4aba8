"""Component tests of ``strata-train`` on the real F3 SEG-Y: prepare, then fit.

The command line runs in subprocesses (``python -m trainer``), as users run it:
MDIO's ingest and the DataLoader workers start processes with ``spawn``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

from trainer.train import DataError, FitError, FitOptions, fit

SUMMARY_KEYS = {
    "steps",
    "batch_size",
    "samples",
    "elapsed_s",
    "samples_per_s",
    "data_wait_fraction",
    "loss_first",
    "loss_last",
    "time_to_first_batch_s",
    "data",
}


def run_cli(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m trainer ARGS`` and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "trainer", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=cwd,
        check=False,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("strata-train: error: ")
    assert "Traceback" not in proc.stderr
    for word in words:
        assert word in lines[0]


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            st = (Path(dirpath) / name).stat()
            out[str(Path(dirpath) / name)] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture(scope="module")
def f3_mdio(seismic: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """F3 converted once by ``python -m trainer prepare``."""
    out = tmp_path_factory.mktemp("prepared") / "f3.mdio"
    proc = run_cli("prepare", "--segy", seismic / "f3.sgy", "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert "23x18x75" in proc.stdout
    return out


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


def test_fit_f3_loss_falls_and_summary_is_complete(f3_mdio: Path, tmp_path: Path) -> None:
    before = _snapshot(f3_mdio)
    out = tmp_path / "run"
    lines: list[str] = []
    summary = fit(
        FitOptions(data=f3_mdio, out=out, steps=30, workers=0, seed=0, log_every=1),
        echo=lines.append,
    )
    assert summary.keys() >= SUMMARY_KEYS
    assert summary == json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 30 and summary["batch_size"] == 8 and summary["samples"] == 240
    assert summary["data"] == str(f3_mdio)
    assert summary["volume"]["shape"] == [23, 18, 75]
    assert 0.0 <= summary["data_wait_fraction"] <= 1.0
    assert summary["samples_per_s"] > 0 and summary["elapsed_s"] > 0

    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 31))
    assert {"step", "loss", "lr", "samples_per_s", "data_wait_fraction"} <= records[0].keys()
    losses = [r["loss"] for r in records]
    assert all(np.isfinite(losses))
    assert np.mean(losses[-10:]) < np.mean(losses[:10])
    assert summary["loss_first"] == losses[0] and summary["loss_last"] == losses[-1]

    assert (out / "checkpoint.pt").is_file()
    assert any("samples/s" in line for line in lines)
    assert _snapshot(f3_mdio) == before  # the data path is never written


@pytest.mark.slow
def test_fit_cli_with_spawned_workers_and_default_out(f3_mdio: Path, tmp_path: Path) -> None:
    proc = run_cli(
        "fit", "--data", f3_mdio, "--steps", "6", "--workers", "2", "--log-every", "3", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert "samples/s" in proc.stdout
    out = tmp_path / "strata-train-out"  # the default --out, in the working directory
    summary = json.loads((out / "summary.json").read_text())
    assert summary.keys() >= SUMMARY_KEYS
    assert summary["workers"] == 2 and summary["mp_context"] == "spawn"
    assert summary["time_to_first_batch_s"] > 0
    assert np.isfinite(summary["loss_last"])
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2


def test_fit_rejects_unusable_data_and_out(f3_mdio: Path, tmp_path: Path) -> None:
    small = tmp_path / "small.zarr"
    group = zarr.open_group(str(small), mode="w")
    group.create_array("amplitude", shape=(8, 8, 8), dtype="float32")
    cases: list[tuple[Path, Path, type[Exception], str]] = [
        (tmp_path / "missing.mdio", tmp_path / "o", DataError, "not found"),
        (tmp_path, tmp_path / "o", DataError, "not a Zarr/MDIO store"),
        (small, tmp_path / "o", DataError, "8x8x8 is smaller than"),
        (f3_mdio, f3_mdio / "runs", FitError, "inside the data path"),
    ]
    for data, out, error, words in cases:
        with pytest.raises(error, match=words):
            fit(FitOptions(data=data, out=out, steps=1, workers=0), echo=lambda _: None)
    assert not (f3_mdio / "runs").exists()
    assert not (tmp_path / "o").exists()


def test_fit_cli_error_is_one_line(tmp_path: Path) -> None:
    proc = run_cli("fit", "--data", tmp_path / "missing.mdio", "--steps", "1")
    assert_one_line_error(proc, "data path not found")
