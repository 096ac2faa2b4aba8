"""Component tests of ``strata-train fit`` and ``eval`` on F3: the loss falls, the summary
and metrics are complete, a run resumes bit for bit (and refuses a different one), bf16
autocast and chunk-aligned sampling, eval's PSNR and section, persistent forkserver
workers, and unusable data, output or options refused in one line.

Training runs in-process with one torch thread (on a loaded 2-core machine OpenMP's
spinning threads otherwise slow a step down several times, measured 5x); the command
line runs in subprocesses (``python -m trainer``), as users run it: the DataLoader
workers start processes with ``spawn`` or ``forkserver``. Preparing the data is in
``test_trainer_cli.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from typer.testing import CliRunner

from tests.component.trainer_support import (
    assert_one_line_error,
    f3_mdio_fixture,  # noqa: F401  (the f3_mdio fixture)
    run_cli,
)
from trainer.checkpoint import load_checkpoint
from trainer.cli import app
from trainer.evaluate import EvalError, EvalOptions, evaluate
from trainer.options import FitError, FitOptions
from trainer.train import fit
from trainer.volume import DataError

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


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            st = (Path(dirpath) / name).stat()
            out[str(Path(dirpath) / name)] = (st.st_size, st.st_mtime_ns)
    return out


def _losses(out: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def f3_run(f3_mdio: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny preset trained for 120 steps on F3 (workers 0, seed 0)."""
    out = tmp_path_factory.mktemp("f3-run")
    fit(
        FitOptions(
            threads=1, data=f3_mdio, out=out, steps=120, workers=0, seed=0, checkpoint_every=50
        ),
        echo=lambda _: None,
    )
    return out


def test_fit_f3_loss_falls_and_summary_is_complete(f3_mdio: Path, f3_run: Path) -> None:
    summary = json.loads((f3_run / "summary.json").read_text())
    assert summary.keys() >= SUMMARY_KEYS
    assert summary["steps"] == 120 and summary["batch_size"] == 8 and summary["samples"] == 960
    assert summary["data"] == str(f3_mdio)
    assert summary["volume"]["shape"] == [23, 18, 75]
    assert summary["volume"]["stats_source"] == "statsV1"  # MDIO's exact statistics
    assert summary["world_size"] == 1 and summary["amp"] is None
    assert 0.0 <= summary["data_wait_fraction"] <= 1.0
    assert summary["samples_per_s"] > 0 and summary["elapsed_s"] > 0

    records = [json.loads(line) for line in (f3_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 121))
    assert {"step", "loss", "lr", "samples_per_s", "data_wait_fraction"} <= records[0].keys()
    losses = [r["loss"] for r in records]
    assert all(np.isfinite(losses))
    assert np.mean(losses[-20:]) < np.mean(losses[:20]) - 0.02  # ~0.98 -> ~0.93 measured
    assert summary["loss_first"] == losses[0] and summary["loss_last"] == losses[-1]
    lrs = [r["lr"] for r in records]
    assert max(lrs) == pytest.approx(1e-3) and lrs[-1] == pytest.approx(1e-4)

    ckpt = load_checkpoint(f3_run / "checkpoint.pt")
    assert ckpt["step"] == 120 and ckpt["plan"]["seed"] == 0
    assert {"model", "optimizer", "scheduler", "rng", "stats"} <= ckpt.keys()


def test_fit_never_writes_under_the_data_path(f3_mdio: Path, tmp_path: Path) -> None:
    before = _snapshot(f3_mdio)
    fit(
        FitOptions(threads=1, data=f3_mdio, out=tmp_path / "o", steps=2, workers=0),
        echo=lambda _: None,
    )
    assert _snapshot(f3_mdio) == before


def test_resume_continues_bit_for_bit(f3_mdio: Path, tmp_path: Path) -> None:
    # 8 steps per epoch: the run crosses an epoch boundary, the stop is mid-epoch
    base = {"data": f3_mdio, "steps": 12, "workers": 0, "epoch_size": 64, "seed": 3}
    quiet = lambda _: None  # noqa: E731
    straight = fit(FitOptions(threads=1, out=tmp_path / "a", **base), echo=quiet)  # type: ignore[arg-type]
    first = fit(FitOptions(threads=1, out=tmp_path / "b", stop_at=6, **base), echo=quiet)  # type: ignore[arg-type]
    assert first["end_step"] == 6 and load_checkpoint(tmp_path / "b" / "checkpoint.pt")["step"] == 6
    second = fit(FitOptions(threads=1, out=tmp_path / "b", resume=True, **base), echo=quiet)  # type: ignore[arg-type]
    assert second["resumed"] and second["start_step"] == 6 and second["steps"] == 6

    a = load_checkpoint(tmp_path / "a" / "checkpoint.pt")
    b = load_checkpoint(tmp_path / "b" / "checkpoint.pt")
    assert a["step"] == b["step"] == 12
    assert a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    for sa, sb in zip(
        a["optimizer"]["state"].values(), b["optimizer"]["state"].values(), strict=True
    ):
        assert all(torch.equal(sa[k], sb[k]) for k in ("exp_avg", "exp_avg_sq", "step"))
    assert a["scheduler"] == b["scheduler"]
    assert torch.equal(a["rng"][0]["mask"], b["rng"][0]["mask"])
    assert straight["params_digest"] == second["params_digest"]
    assert _losses(tmp_path / "a") == _losses(tmp_path / "b")  # the log continues exactly


def test_resume_refuses_a_different_run(f3_mdio: Path, tmp_path: Path) -> None:
    quiet = lambda _: None  # noqa: E731
    with pytest.raises(FitError, match="no checkpoint"):
        fit(
            FitOptions(threads=1, data=f3_mdio, out=tmp_path, steps=4, workers=0, resume=True),
            echo=quiet,
        )
    fit(
        FitOptions(threads=1, data=f3_mdio, out=tmp_path, steps=4, workers=0, stop_at=2), echo=quiet
    )
    with pytest.raises(FitError, match=r"plan\.batch_size was 8, this run has 4"):
        fit(
            FitOptions(
                threads=1, data=f3_mdio, out=tmp_path, steps=4, workers=0, batch_size=4, resume=True
            ),
            echo=quiet,
        )
    with pytest.raises(FitError, match=r"schedule\.total_steps was 4"):
        fit(
            FitOptions(threads=1, data=f3_mdio, out=tmp_path, steps=9, workers=0, resume=True),
            echo=quiet,
        )
    done = fit(
        FitOptions(threads=1, data=f3_mdio, out=tmp_path, steps=4, workers=0, resume=True),
        echo=quiet,
    )
    assert done["start_step"] == 2 and done["end_step"] == 4
    with pytest.raises(FitError, match="nothing to do"):
        fit(
            FitOptions(threads=1, data=f3_mdio, out=tmp_path, steps=4, workers=0, resume=True),
            echo=quiet,
        )


def test_bf16_autocast_and_chunk_aligned_sampling(f3_mdio: Path, tmp_path: Path) -> None:
    summary = fit(
        FitOptions(
            threads=1, data=f3_mdio, out=tmp_path, steps=3, workers=0, amp=True, chunk_aligned=True
        ),
        echo=lambda _: None,
    )
    assert summary["amp"] == "bf16" and np.isfinite(summary["loss_last"])
    assert summary["plan"]["align_chunks"] == [64, 64, 64]


def test_eval_psnr_beats_the_baseline_and_draws_the_section(
    f3_mdio: Path, f3_run: Path, tmp_path: Path
) -> None:
    lines: list[str] = []
    result = evaluate(
        EvalOptions(
            ckpt=f3_run / "checkpoint.pt", data=f3_mdio, out=tmp_path, patches=64, threads=1
        ),
        echo=lines.append,
    )
    assert result == json.loads((tmp_path / "eval.json").read_text())
    assert result["patches"] == 64 and result["held_out"] > 0
    assert result["checkpoint_step"] == 120
    assert result["psnr_db"] > result["baseline_psnr_db"] + 0.1  # learned more than token means
    assert 5 < result["psnr_db"] < 60
    png = Path(result["section"]["png"])
    assert png == tmp_path / "eval-section.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    image = matplotlib.image.imread(png)
    assert image.ndim == 3 and image.shape[1] > image.shape[0] > 200  # three panels side by side
    assert result["section"]["inline"] == 122  # the middle inline's number, 111 + 23 // 2
    assert any("PSNR" in line for line in lines)


def test_eval_cli_errors_are_one_line(f3_mdio: Path, f3_run: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    cases = [
        (["--ckpt", str(tmp_path / "none.pt"), "--data", str(f3_mdio)], "no checkpoint"),
        (
            [
                "--ckpt",
                str(f3_run / "checkpoint.pt"),
                "--data",
                str(f3_mdio),
                "--out",
                str(f3_mdio),
            ],
            "inside the data path",
        ),
        (
            ["--ckpt", str(f3_run / "checkpoint.pt"), "--data", str(f3_mdio), "--inline", "99"],
            "outside [0, 23)",
        ),
    ]
    for args, words in cases:
        result = runner.invoke(app, ["eval", *args])
        assert result.exit_code == 2, result.output
        assert result.stderr.count("\n") == 1 and words in result.stderr
    with pytest.raises(EvalError, match="--patches"):
        evaluate(EvalOptions(ckpt=f3_run / "checkpoint.pt", data=f3_mdio, patches=0))


@pytest.mark.slow
def test_fit_cli_persistent_forkserver_workers_read_the_planned_data(
    f3_mdio: Path, tmp_path: Path
) -> None:
    """Workers started once serve three epochs and give the in-process loader's exact losses."""
    common = ["--steps", "10", "--epoch-size", "32", "--threads", "1", "--seed", "4"]
    proc = run_cli(
        "fit",
        "--data",
        f3_mdio,
        "--workers",
        "2",
        "--mp-context",
        "forkserver",
        *common,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "samples/s" in proc.stdout
    out = tmp_path / "strata-train-out"  # the default --out, in the working directory
    summary = json.loads((out / "summary.json").read_text())
    assert summary.keys() >= SUMMARY_KEYS
    assert summary["workers"] == 2 and summary["mp_context"] == "forkserver"
    assert summary["epochs_started"] == 3 and summary["steps_per_epoch"] == 4
    assert summary["time_to_first_batch_s"] > 0
    reference = fit(
        FitOptions(
            threads=1,
            data=f3_mdio,
            out=tmp_path / "ref",
            steps=10,
            epoch_size=32,
            seed=4,
            workers=0,
        ),
        echo=lambda _: None,
    )
    assert _losses(out) == _losses(tmp_path / "ref")
    assert summary["params_digest"] == reference["params_digest"]


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
            fit(FitOptions(threads=1, data=data, out=out, steps=1, workers=0), echo=lambda _: None)
    assert not (f3_mdio / "runs").exists()
    assert not (tmp_path / "o").exists()
    for options, words in [
        ({"stop_at": 5}, "--stop-at"),
        ({"epoch_size": 4}, "epoch size 4 is smaller than one batch"),
        ({"seed": -1}, "--seed"),
        ({"preset": "huge"}, "unknown preset"),
    ]:
        with pytest.raises(FitError, match=words):
            fit(
                FitOptions(
                    threads=1, data=f3_mdio, out=tmp_path / "o", steps=2, workers=0, **options
                ),  # type: ignore[arg-type]
                echo=lambda _: None,
            )


def test_fit_cli_error_is_one_line(tmp_path: Path) -> None:
    proc = run_cli("fit", "--data", tmp_path / "missing.mdio", "--steps", "1")
    assert_one_line_error(proc, "data path not found")
