"""The loader-only mode (``strata-train load``, trainer.loadonly): every planned patch read
exactly once per epoch, and the bytes it reads are the bytes a local read reads.

A tiny synthetic volume with dead traces; DataLoader workers started with ``spawn`` as in
``fit``. The expected bytes are computed independently of the loader: the stored size of
every amplitude chunk each planned patch touches (trainer.readorder's access trace), and the
patches read in this process straight from the dataset.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from trainer.cli import app
from trainer.dataloader import build_dataset
from trainer.loadonly import LoadOptions, run_load
from trainer.options import FitError, FitOptions
from trainer.plan import positions_digest
from trainer.presets import get_preset
from trainer.readorder import planned_chunk_keys
from trainer.synth import synth
from trainer.synthspec import SynthSpec


def load_options(volume: Path, **changes: object) -> LoadOptions:
    """A run of two 24-patch epochs of batches of 4 (seed 7, patches >= 60 % live)."""
    fields: dict[str, object] = {"epoch_size": 24, "batch_size": 4, "seed": 7}
    return LoadOptions(data=volume, min_live_fraction=0.6, **{**fields, **changes})


@pytest.fixture(scope="module")
def volume(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("loadonly") / "syn.mdio"
    synth(out, SynthSpec(shape=(24, 20, 64), chunks=(8, 8, 32), seed=4, dead_fraction=0.1))
    return out


def expected_reads(volume: Path, epochs: int) -> list[dict[str, object]]:
    """Per epoch: the plan's corners (digest, count), stored bytes and payload digest."""
    config = get_preset("tiny")
    fit_opts = FitOptions(data=volume, seed=7, epoch_size=24, min_live_fraction=0.6)
    info, dataset, plan = build_dataset(fit_opts, config, 4)
    out = []
    payload = hashlib.sha256()
    for e in range(epochs):
        shard = plan.shard(e)
        keys = planned_chunk_keys(info, shard, config.input_size, unique=False, include_mask=False)
        stored = sum((volume / key).stat().st_size for key in keys)
        for first in range(0, len(shard), 4):
            batch = np.stack([dataset.read_patch(c) for c in shard[first : first + 4]])
            payload.update(batch[:, None].tobytes())
        out.append({"samples": len(shard), "reads_digest": positions_digest(shard),
                    "store_bytes": stored, "payload_bytes": len(shard) * 32 * 1024})  # fmt: skip
    return [*out, {"payload_digest": payload.hexdigest()}]


def test_store_and_memory_read_every_planned_patch_once_and_the_local_bytes(
    volume: Path,
) -> None:
    *want, whole = expected_reads(volume, epochs=2)
    assert all(w["store_bytes"] for w in want)
    runs = {}
    for source, workers in (("store", 2), ("memory", 1)):
        opts = load_options(volume, source=source, workers=workers, epochs=2, digest=True)
        runs[source] = run_load(opts, echo=lambda _line: None)
    for source, summary in runs.items():
        assert summary["samples"] == 2 * 24
        assert summary["payload_digest"] == whole["payload_digest"], source
        for got, w in zip(summary["epochs"], want, strict=True):
            assert got["samples"] == w["samples"]
            assert got["reads_digest"] == w["reads_digest"], source  # each once, in plan order
            assert got["payload_bytes"] == w["payload_bytes"]
            assert got["store_bytes"] == (w["store_bytes"] if source == "store" else 0)
        assert summary["samples_per_s"] > 0 and 0 <= summary["data_wait_fraction"] <= 1
    assert runs["memory"]["memory_bytes"] >= 24 * 20 * 64 * 4


def test_emulated_compute_time_is_spent_per_batch(volume: Path) -> None:
    idle, busy = (
        run_load(load_options(volume, workers=0, epochs=1, compute_ms=ms), echo=lambda _: None)
        for ms in (0, 50)
    )
    timed_batches = busy["samples"] // 4 - 1  # the first batch is start-up
    assert busy["epochs"][0]["elapsed_s"] >= 0.05 * timed_batches
    assert idle["data_wait_fraction"] > busy["data_wait_fraction"]  # the sleep is not a wait


def test_load_cli_prints_each_epoch_and_writes_the_summary(volume: Path, tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    args = ["load", "--data", str(volume), "--workers", "0", "--epochs", "2",
            "--epoch-size", "24", "--batch-size", "4", "--seed", "7", "--min-live", "0.6",
            "--json", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == ["epoch 0", "epoch 1", "store"]
    assert "MB/s payload" in lines[0] and "data wait" in lines[0]
    summary = json.loads(out.read_text())
    assert [e["epoch"] for e in summary["epochs"]] == [0, 1]
    first, second = summary["epochs"]
    assert first["started_at"] < first["ended_at"] <= second["started_at"] < second["ended_at"]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--source", "disk"], "--source must be one of store, memory"),
        (["--epochs", "0"], "--epochs must be >= 1, got 0"),
        (["--compute-ms", "-1"], "--compute-ms must be >= 0, got -1.0"),
    ],
)
def test_load_cli_errors_are_one_line(volume: Path, args: list[str], words: str) -> None:
    result = CliRunner().invoke(app, ["load", "--data", str(volume), *args])
    assert result.exit_code == 2
    assert result.output.strip() == f"strata-train: error: {words}"


def test_missing_path_is_the_fit_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["load", "--data", str(tmp_path / "nope.mdio")])
    assert result.exit_code == 2
    assert (
        result.output.strip() == f"strata-train: error: data path not found: {tmp_path}/nope.mdio"
    )
    with pytest.raises(FitError, match="unknown preset"):
        run_load(LoadOptions(data=tmp_path, preset="huge"))
