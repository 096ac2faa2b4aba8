"""``strata-train`` on an object-store URL: ``fit``, ``plan``, ``eval`` and the loader-only
``load`` on ``s3://`` read what they read on a local copy (issue 41 items 0 and 2).

The volume is a tiny synthetic MDIO store (:mod:`trainer.synth`) uploaded to a real
SeaweedFS (tests/integration/seaweedfs.py). ``fit`` runs as users run it, in a subprocess
whose DataLoader workers open the URL themselves, with the endpoint and credentials in
the usual environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``...); ``plan`` takes
them as ``--storage-option`` flags instead. The local runs train in-process with one
thread, as tests/component/test_trainer_fit.py does.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.integration.hub_support import S3_ENV, S3Server
from tests.integration.seaweedfs import seaweedfs_fixture  # noqa: F401  (seaweedfs)
from trainer.cli import app
from trainer.evaluate import EvalOptions, evaluate
from trainer.loadonly import LoadOptions, run_load
from trainer.options import FitOptions
from trainer.synth import synth
from trainer.synthspec import SynthSpec
from trainer.train import fit

_buckets = itertools.count()

FIT = ("--steps", "4", "--epoch-size", "16", "--batch-size", "4", "--seed", "5")


@pytest.fixture(scope="module")
def local_volume(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 24x20x64 volume with dead traces (so the live mask is read too)."""
    out = tmp_path_factory.mktemp("s3-volume") / "syn.mdio"
    synth(out, SynthSpec(shape=(24, 20, 64), chunks=(8, 8, 32), seed=2, dead_fraction=0.1))
    return out


@pytest.fixture(name="s3_volume")
def s3_volume_fixture(seaweedfs: S3Server, local_volume: Path) -> str:
    """The same volume under ``s3://<fresh bucket>/team/v1/syn.mdio``."""
    import s3fs

    fs = s3fs.S3FileSystem(
        key=S3_ENV["AWS_ACCESS_KEY_ID"],
        secret=S3_ENV["AWS_SECRET_ACCESS_KEY"],
        endpoint_url=seaweedfs.endpoint,
    )
    bucket = f"trainer-{os.getpid()}-{next(_buckets)}"
    fs.mkdir(bucket)
    fs.put(str(local_volume), f"{bucket}/team/v1/syn.mdio", recursive=True)
    return f"s3://{bucket}/team/v1/syn.mdio"


@pytest.fixture(name="s3_env")
def s3_env_fixture(seaweedfs: S3Server, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment a user points s3fs at the server with (set here and returned)."""
    env = {**S3_ENV, "AWS_ENDPOINT_URL": seaweedfs.endpoint}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


def _cli(*args: str | Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainer", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, **env},
        check=False,
    )


def _fit_local(volume: Path, out: Path) -> dict[str, object]:
    opts = FitOptions(
        data=volume, out=out, steps=4, epoch_size=16, batch_size=4, seed=5, workers=0, threads=1
    )
    return fit(opts, echo=lambda _line: None)


def test_fit_on_s3_trains_on_the_same_patches_as_on_a_local_copy(
    s3_volume: str, s3_env: dict[str, str], local_volume: Path, tmp_path: Path
) -> None:
    proc = _cli("fit", "--data", s3_volume, *FIT, "--workers", "1", "--threads", "1",
                "--out", tmp_path / "s3", env=s3_env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    remote = json.loads((tmp_path / "s3" / "summary.json").read_text())
    local = _fit_local(local_volume, tmp_path / "local")
    assert remote["data"] == s3_volume
    # the same patches, normalised the same way, give the same parameters bit for bit
    assert remote["volume"] == local["volume"]
    assert remote["loss_first"] == local["loss_first"]
    assert remote["params_digest"] == local["params_digest"]
    summary_text = (tmp_path / "s3" / "summary.json").read_text()
    assert "storage_options" not in summary_text


def test_plan_on_s3_with_storage_options_lists_the_local_read_order(
    s3_volume: str, seaweedfs: S3Server, local_volume: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(key, raising=False)
    runner = CliRunner()
    args = ["plan", "--epoch-size", "32", "--all-reads", "--min-live", "0.6"]
    flags = [
        "--storage-option", f"endpoint_url={seaweedfs.endpoint}",
        "--storage-option", f"key={S3_ENV['AWS_ACCESS_KEY_ID']}",
        "--storage-option", f"secret={S3_ENV['AWS_SECRET_ACCESS_KEY']}",
    ]  # fmt: skip
    remote = runner.invoke(app, [*args, "--data", s3_volume, *flags])
    local = runner.invoke(app, [*args, "--data", str(local_volume)])
    assert remote.exit_code == 0, remote.output
    assert local.exit_code == 0, local.output
    assert remote.output == local.output
    assert "amplitude/c/" in remote.output


def test_eval_on_s3_scores_the_same_patches_as_on_a_local_copy(
    s3_volume: str, s3_env: dict[str, str], local_volume: Path, tmp_path: Path
) -> None:
    del s3_env  # in this process's environment
    _fit_local(local_volume, tmp_path / "run")
    ckpt = tmp_path / "run" / "checkpoint.pt"
    results = []
    for name, data in (("local", local_volume), ("s3", s3_volume)):
        opts = EvalOptions(ckpt=ckpt, data=data, out=tmp_path / name, patches=8, batch_size=4,
                           device="cpu", threads=1)  # fmt: skip
        results.append(evaluate(opts, echo=lambda _line: None))
    local, remote = results
    assert remote["data"] == s3_volume
    assert remote["psnr_db"] == local["psnr_db"]
    assert remote["held_out_fraction"] == local["held_out_fraction"]


def test_loader_only_reads_the_same_bytes_through_s3fs_as_from_local_disk(
    s3_volume: str, s3_env: dict[str, str], local_volume: Path
) -> None:
    del s3_env  # in this process's environment, which the spawned worker inherits
    runs = [
        run_load(
            LoadOptions(data=data, workers=1, epochs=2, epoch_size=16, batch_size=4, digest=True),
            echo=lambda _line: None,
        )
        for data in (local_volume, s3_volume)
    ]
    local, remote = runs
    assert remote["data"] == s3_volume
    assert remote["payload_digest"] == local["payload_digest"]
    for got, want in zip(remote["epochs"], local["epochs"], strict=True):
        assert got["reads_digest"] == want["reads_digest"]
        assert got["store_bytes"] == want["store_bytes"] > 0


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ("s3://{bucket}/team/v1/missing.mdio", ("data path not found: s3://",)),
        ("s3:/{bucket}/team/v1/syn.mdio", ("data path not found: s3:/",)),  # a local path
    ],
)
def test_missing_url_is_a_one_line_error(
    s3_volume: str, s3_env: dict[str, str], data: str, words: tuple[str, ...], tmp_path: Path
) -> None:
    bucket = s3_volume.split("/")[2]
    runner = CliRunner()
    result = runner.invoke(app, ["plan", "--data", data.format(bucket=bucket)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("strata-train: error: "), result.output
    assert all(word in lines[0] for word in words), lines[0]
