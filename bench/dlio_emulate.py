"""DLIO's emulated accelerators without DLIO (``python -m bench.dlio --emulate``).

What :mod:`bench.dlio` measures with ``dlio-benchmark`` itself, by DLIO's published rule,
in this interpreter: no MPI, TensorFlow or DLIO venv, so the suite can afford it. The data
set is DLIO's NPZ set as its NPZ generator writes it (``train/img_<i>_of_<n>.npz``: ``x``
a ``(d, d, 1)`` uint8 array of about the record length, ``y`` its label), so either mode
reads what the other generated. An emulated accelerator is a process (a *rank*) that,
every epoch, reads its share of the files — shuffled with the epoch's seed, ``steps =
files // (batch × ranks)`` batches a rank, the rest left unread as DLIO does — through
``read_threads`` reader threads that load whole batches ahead (two a thread, as PyTorch's
DataLoader prefetches), and "computes" each batch by sleeping the workload's compute time
(``unet3d_h100``: 0.323 s a batch of 7). The trainer's loader-only mode
(``strata-train load --compute-ms``) is the same kind of emulated accelerator, but it reads
patches of a Zarr volume, not a set of NPZ files; this reader reads DLIO's files.

Per rank and epoch it records the compute time and the time blocked waiting for the next
batch (I/O wait), both without the epoch's first step (DLIO leaves it out too: it holds the
readers' start), and AU = compute ÷ (compute + I/O wait). A run's figures are aggregated
as DLIO's ``statscounter`` does: per epoch the mean over ranks, then the mean and the
(population) standard deviation over epochs; ``epoch_au`` is rank 0's, as DLIO logs it;
I/O MB/s (MiB, as DLIO's) is the bytes all ranks read in an epoch over its wall time,
averaged over epochs. Ranks start each epoch together (a file barrier, as DLIO's MPI
barrier).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

COMPUTE_S = 0.323
"""``unet3d_h100``'s ``train.computation_time``: emulated compute time per batch, s."""
BATCH = 7
"""``unet3d_h100``'s ``reader.batch_size``."""
PREFETCH = 2
"""Batches each reader thread loads ahead (PyTorch DataLoader's ``prefetch_factor``)."""
MIB = 2**20


def au_percent(compute_s: float, wait_s: float) -> float:
    """DLIO's rule: AU = compute ÷ (compute + I/O wait), in % (0 when nothing was computed,
    as DLIO reports an epoch of a single step)."""
    if compute_s <= 0.0:
        return 0.0
    return 100.0 * compute_s / (compute_s + wait_s)


def generate(folder: Path, files: int, record_bytes: int, seed: int = 10) -> list[Path]:
    """Write DLIO's NPZ training set into ``folder/train``; returns the files in order."""
    train = folder / "train"
    train.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    dim = max(1, math.isqrt(record_bytes))
    width = len(str(files))
    paths = []
    for i in range(files):
        path = train / f"img_{i:0{width}d}_of_{files}.npz"
        x = rng.integers(0, 255, size=(dim, dim, 1), dtype=np.uint8)
        np.savez(path, x=x, y=np.zeros(1, dtype=np.int64))
        paths.append(path)
    return paths


def _load(paths: list[Path]) -> int:
    """Read one batch as DLIO's NPZ reader does (``np.load(f)["x"]``); returns its bytes."""
    size = 0
    for path in paths:
        with np.load(path) as npz:
            npz["x"]
        size += path.stat().st_size
    return size


def _barrier(folder: Path, name: str, rank: int, ranks: int, timeout: float = 120.0) -> None:
    (folder / f"{name}-{rank}").touch()
    deadline = time.monotonic() + timeout
    while sum(1 for _ in folder.glob(f"{name}-*")) < ranks:
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {rank}: the other ranks did not reach {name}")
        time.sleep(0.005)


def rank_epochs(ns: argparse.Namespace) -> list[dict[str, Any]]:
    """One rank's epochs (see the module docstring); one record per epoch."""
    files = sorted((Path(ns.folder) / "train").glob("*.npz"))
    steps = len(files) // (ns.batch * ns.ranks)
    records = []
    with ThreadPoolExecutor(ns.read_threads) as pool:
        for epoch in range(ns.epochs):
            order = list(files)
            random.Random(ns.seed + epoch).shuffle(order)
            mine = order[ns.rank * steps * ns.batch : (ns.rank + 1) * steps * ns.batch]
            batches = [mine[i : i + ns.batch] for i in range(0, len(mine), ns.batch)]
            _barrier(Path(ns.barrier), f"e{epoch}", ns.rank, ns.ranks)
            started = time.perf_counter()
            ahead: deque[Future[int]] = deque()
            queued = 0
            compute = wait = first = 0.0
            nbytes = 0
            for step in range(len(batches)):
                while queued < len(batches) and len(ahead) < PREFETCH * ns.read_threads:
                    ahead.append(pool.submit(_load, batches[queued]))
                    queued += 1
                t0 = time.perf_counter()
                nbytes += ahead.popleft().result()
                t1 = time.perf_counter()
                time.sleep(ns.compute_s)
                if step == 0:
                    first = time.perf_counter() - t0
                    continue
                wait += t1 - t0
                compute += ns.compute_s
            wall = time.perf_counter() - started
            records.append({
                "rank": ns.rank, "epoch": epoch, "steps": len(batches), "compute_s": compute,
                "wait_s": wait, "first_step_s": first, "wall_s": wall, "bytes": nbytes,
                "au": au_percent(compute, wait),
            })  # fmt: skip
    return records


def aggregate(records: list[dict[str, Any]]) -> dict[str, Any]:
    """A run's ``au``, ``au_sd``, ``epoch_au`` and ``io_mb_s`` from its ranks' epoch
    records, as DLIO's ``statscounter`` aggregates them (see the module docstring)."""
    epochs = sorted({r["epoch"] for r in records})
    per_epoch = [[r for r in records if r["epoch"] == e] for e in epochs]
    au = [float(np.mean([r["au"] for r in rs])) for rs in per_epoch]
    io = [sum(r["bytes"] / r["wall_s"] for r in rs) / MIB for rs in per_epoch]
    return {
        "au": float(np.mean(au)), "au_sd": float(np.std(au)),
        "epoch_au": [r["au"] for r in sorted(records, key=lambda r: r["epoch"]) if r["rank"] == 0],
        "io_mb_s": float(np.mean(io)),
    }  # fmt: skip


def train(
    ns: argparse.Namespace, source: str, folder: Path, ranks: int, out: Path
) -> dict[str, Any]:
    """One emulated run on ``ranks`` accelerators reading ``folder`` (as
    :func:`bench.dlio.train`, plus ``compute_s`` and the ranks' epoch ``records``).

    Raises:
        RuntimeError: A rank failed.
    """
    barrier = out / "barrier"
    barrier.mkdir(parents=True, exist_ok=True)
    compute_s = COMPUTE_S * ns.compute_scale
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    common = ["--folder", str(folder), "--ranks", str(ranks), "--epochs", str(ns.epochs),
              "--batch", str(ns.batch), "--read-threads", str(ns.read_threads),
              "--compute-s", repr(compute_s), "--barrier", str(barrier)]  # fmt: skip
    started = time.monotonic()
    procs = [
        subprocess.Popen([sys.executable, "-m", "bench.dlio_emulate", *common, "--rank", str(r)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for r in range(ranks)
    ]  # fmt: skip
    outputs = [p.communicate() for p in procs]
    wall = time.monotonic() - started
    records: list[dict[str, Any]] = []
    for r, (p, (stdout, stderr)) in enumerate(zip(procs, outputs, strict=True)):
        if p.returncode != 0:
            raise RuntimeError(f"emulated {source} x{ranks}: rank {r} exited {p.returncode}: "
                               f"{stderr[-500:]}")  # fmt: skip
        records.extend(json.loads(stdout))
    return {"source": source, "ranks": ranks, "wall_s": round(wall, 1), **aggregate(records),
            "compute_s": compute_s, "records": records}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """One rank (started by :func:`train`): prints its epoch records as JSON."""
    p = argparse.ArgumentParser(prog="python -m bench.dlio_emulate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--folder", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--ranks", type=int, required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=BATCH)
    p.add_argument("--read-threads", type=int, default=1)
    p.add_argument("--compute-s", type=float, default=COMPUTE_S)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--barrier", required=True, help="a folder the ranks share")
    ns = p.parse_args(argv)
    print(json.dumps(rank_epochs(ns)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
