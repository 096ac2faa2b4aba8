"""Distributed data parallel training: two ranks on the CPU (gloo), launched by torchrun.

Each rank must train on its own shard of every epoch's patch list, and the
ranks must end with bit-identical parameters (DDP averages the gradients). The
launcher binds to the loopback interface only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import HTTPServer
from pathlib import Path

import pytest
import torch

from tests.component.test_trainer_hints import _Recorder
from trainer.checkpoint import load_checkpoint, params_digest
from trainer.model import MaskedAutoencoder3D
from trainer.plan import build_plan, positions_digest
from trainer.presets import MAEConfig
from trainer.readorder import epoch_read_order
from trainer.synth import synth
from trainer.synthspec import SynthSpec
from trainer.volume import inspect_volume

STEPS, BATCH, EPOCH = 6, 4, 32  # 4 steps per epoch: the run crosses into epoch 1


@pytest.fixture(scope="module")
def volume(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ddp") / "synth.mdio"
    synth(out, SynthSpec(shape=(40, 36, 64), chunks=(16, 16, 32), seed=2, dead_fraction=0.05))
    return out


def _torchrun(*args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "GLOO_SOCKET_IFNAME": "lo",  # gloo's pairs on the loopback interface only
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",  # rendezvous on localhost, a free port
            "--nproc-per-node",
            "2",
            "-m",
            "trainer",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        check=False,
    )


@pytest.mark.slow
def test_two_ranks_train_distinct_shards_to_identical_parameters(
    volume: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    proc = _torchrun(
        "fit",
        "--data", str(volume),
        "--out", str(out),
        "--steps", str(STEPS),
        "--batch-size", str(BATCH),
        "--epoch-size", str(EPOCH),
        "--workers", "0",
        "--seed", "1",
        "--device", "cpu",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "on 2 ranks" in proc.stdout
    assert proc.stdout.count("trained steps") == 1  # only rank 0 reports

    reports = [json.loads((out / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [r["rank"] for r in reports] == [0, 1]
    assert all(r["world_size"] == 2 and r["reads"] == STEPS * BATCH for r in reports)

    # each rank read exactly its planned shard: epoch 0 whole, then half of epoch 1
    info = inspect_volume(volume)
    plan = build_plan(info, (16, 16, 32), epoch_size=EPOCH, batch_size=BATCH, seed=1, world_size=2)
    assert plan.steps_per_epoch == 4
    for rank, report in enumerate(reports):
        read = list(plan.shard(0, rank)) + list(plan.shard(1, rank)[: 2 * BATCH])
        assert report["read_digest"] == positions_digest(read)
    assert reports[0]["read_digest"] != reports[1]["read_digest"]

    # DDP kept the replicas bit-identical, and rank 0's checkpoint holds them
    assert reports[0]["params_digest"] == reports[1]["params_digest"]
    ckpt = load_checkpoint(out / "checkpoint.pt")
    assert ckpt["step"] == STEPS and len(ckpt["rng"]) == 2
    assert not torch.equal(ckpt["rng"][0]["mask"], ckpt["rng"][1]["mask"])  # per-rank masks
    model = MaskedAutoencoder3D(MAEConfig(**ckpt["preset"]))
    model.load_state_dict(ckpt["model"])
    assert params_digest(model) == reports[0]["params_digest"]

    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["samples"] == STEPS * BATCH * 2
    assert summary["epochs_started"] == 2
    metrics = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in metrics] == list(range(1, STEPS + 1))


@pytest.mark.slow
def test_each_rank_posts_its_own_hint_stream(volume: Path, tmp_path: Path) -> None:
    _Recorder.posts, _Recorder.deletes = [], []
    httpd = HTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        proc = _torchrun(
            "fit",
            "--data", str(volume),
            "--out", str(tmp_path / "run"),
            "--steps", str(STEPS),
            "--batch-size", str(BATCH),
            "--epoch-size", str(EPOCH),
            "--workers", "0",
            "--seed", "1",
            "--device", "cpu",
            "--hints", f"http://127.0.0.1:{httpd.server_address[1]}",
            "--hints-dataset", "synth",
            "--hints-ref", "v1",
            "--hints-stream", "ddp",
        )  # fmt: skip
    finally:
        httpd.shutdown()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    info = inspect_volume(volume)
    plan = build_plan(info, (16, 16, 32), epoch_size=EPOCH, batch_size=BATCH, seed=1, world_size=2)
    for rank in (0, 1):
        mine = [body for _, body, _ in _Recorder.posts if body["stream"] == f"ddp.rank{rank}"]
        assert [b["append"] for b in mine] == [False, True, True]  # epochs 0, 1, then 2
        for epoch, body in enumerate(mine):
            want = ["synth.mdio/" + k for k in epoch_read_order(plan, info, epoch, rank)]
            assert body["paths"] == want and body["dataset"] == "synth"
    assert sorted(_Recorder.deletes) == ["/v1/hints/ddp.rank0", "/v1/hints/ddp.rank1"]
