"""The loader-only mode (``strata-train load``): the training run's data path with no model.

It builds what ``fit`` builds — the same volume inspection, statistics, epoch plan,
:class:`~trainer.plan.EpochSampler`, patch dataset, DataLoader workers and collation
(:func:`trainer.dataloader.build_dataset`, :func:`trainer.dataloader.make_loader`) — and
drains the loader for whole epochs, optionally sleeping a fixed emulated compute time
per batch (an emulated accelerator, as MLPerf Storage's DLIO does), so the load on the
file system is what a GPU job's loader would put on it rather than what two CPU cores
training a model can consume.

Two sources feed the same loader:

* ``store`` reads the Zarr store (a directory, a mount, or an fsspec URL) through a
  :class:`~trainer.loadsources.CountingStore`, so each item also carries the bytes its
  read fetched from the amplitude array's stored chunks (what the file system or object
  store delivered); a URL through fsspec or, with ``client="obstore"``, zarr's
  ``ObjectStore``;
* ``memory`` reads the same amplitudes and live mask from one copy held in shared
  memory, loaded before the workers start
  (:class:`~trainer.loadsources.MemoryPatchDataset`): the loader's own ceiling (slicing,
  normalisation and the worker-to-main hand-off, with no store and no decoding), so a
  loader-bound result is not blamed on the file system.

Measured, per epoch, with ``time.perf_counter``: samples, the wall time, samples/s,
payload MB/s (float32 patch bytes handed to the training process), store MB/s (stored
chunk bytes read, ``store`` only), and the data-wait share (time blocked in
``next(loader)`` over the epoch's wall time). The run's first batch includes starting
the workers: its wait is reported as ``time_to_first_batch_s`` and epoch 0's rates
count the batches after it, as ``fit``'s steady-state figures do. Every epoch also
reports a SHA-256 of the corners read, in order, which equals
:func:`trainer.plan.positions_digest` of the plan's shard exactly when every planned
patch was read once and nothing else was.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainer.dataloader import STREAM_LOADER, build_dataset, make_loader
from trainer.dataset import PatchDataset
from trainer.loadsources import CountedPatchDataset, MemoryPatchDataset
from trainer.location import StorageOptions
from trainer.objstore import CLIENTS
from trainer.options import FitError, FitOptions
from trainer.plan import EpochSampler, derive_seed
from trainer.presets import get_preset

SOURCES = ("store", "memory")
"""Where the loader's workers read patches from (see the module docstring)."""

MB = 1e6


@dataclass(frozen=True)
class LoadOptions:
    """What a loader-only run is asked (the fields ``fit`` shares mean what they mean there).

    Attributes:
        data: Zarr/MDIO store: a local directory or an fsspec URL.
        preset: Model preset whose patch shape and batch size are read.
        batch_size: Patches per batch; ``None`` for the preset's.
        workers: DataLoader worker processes; 0 reads in this process.
        mp_context: Worker start method, ``"spawn"`` or ``"forkserver"``.
        epochs: Whole epochs to read (>= 1).
        epoch_size: Patch positions per epoch.
        seed: The run's seed (the same seed reads the same patches as ``fit``).
        chunk_aligned: Place patches to read as few chunks as possible.
        min_live_fraction: Reject patches with fewer live traces.
        compute_ms: Emulated compute time per batch, milliseconds (0: none).
        source: ``"store"`` or ``"memory"`` (see :data:`SOURCES`).
        digest: Also hash every batch's bytes, in order (``payload_digest``; costs CPU
            in the training process, so off when measuring).
        storage_options: fsspec options of a URL ``data`` (obstore config keys with
            ``client="obstore"``).
        client: How the ``store`` source reads a URL ``data``: ``"fsspec"`` or
            ``"obstore"`` (zarr's ``ObjectStore``, :mod:`trainer.objstore`).
    """

    data: str | Path
    preset: str = "tiny"
    batch_size: int | None = None
    workers: int = 2
    mp_context: str = "spawn"
    epochs: int = 1
    epoch_size: int = 1024
    seed: int = 0
    chunk_aligned: bool = False
    min_live_fraction: float = 0.5
    compute_ms: float = 0.0
    source: str = "store"
    digest: bool = False
    storage_options: StorageOptions = field(default_factory=dict, repr=False)
    client: str = "fsspec"


def _check(opts: LoadOptions, batch_size: int) -> None:
    checks = [
        (opts.epochs >= 1, f"--epochs must be >= 1, got {opts.epochs}"),
        (opts.compute_ms >= 0, f"--compute-ms must be >= 0, got {opts.compute_ms}"),
        (opts.source in SOURCES, f"--source must be one of {', '.join(SOURCES)}"),
        (opts.client in CLIENTS, f"--client must be one of {', '.join(CLIENTS)}"),
        (batch_size >= 1, f"--batch-size must be >= 1, got {batch_size}"),
        (opts.workers >= 0, f"--workers must be >= 0, got {opts.workers}"),
        (opts.seed >= 0, f"--seed must be >= 0, got {opts.seed}"),
        (
            opts.mp_context in ("spawn", "forkserver"),
            f"worker start method must be spawn or forkserver, not {opts.mp_context}",
        ),
        (
            0.0 <= opts.min_live_fraction <= 1.0,
            f"--min-live must be in [0, 1], got {opts.min_live_fraction}",
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise FitError(message)


@dataclass
class _Epoch:
    """One epoch's counts, for the report."""

    epoch: int
    samples: int = 0
    payload_bytes: int = 0
    store_bytes: int = 0
    timed_samples: int = 0
    timed_payload: int = 0
    timed_store: int = 0
    wait_s: float = 0.0
    timed_s: float = 0.0
    elapsed_s: float = 0.0
    started_at: float = 0.0
    ended_at: float = 0.0
    reads: Any = field(default_factory=hashlib.sha256)

    def record(self) -> dict[str, Any]:
        timed = self.timed_s or float("nan")
        return {
            "epoch": self.epoch,
            "samples": self.samples,
            "elapsed_s": self.elapsed_s,
            "samples_per_s": self.timed_samples / timed,
            "payload_mb_per_s": self.timed_payload / MB / timed,
            "store_mb_per_s": self.timed_store / MB / timed,
            "data_wait_fraction": self.wait_s / timed,
            "payload_bytes": self.payload_bytes,
            "store_bytes": self.store_bytes,
            "reads_digest": self.reads.hexdigest(),
            "started_at": self.started_at,
            "ended_at": self.ended_at,
        }


def run_load(opts: LoadOptions, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Drain the training DataLoader for ``opts.epochs`` epochs and report its rates.

    Args:
        opts: The run.
        echo: Receives one line per epoch and a total.

    Returns:
        The summary: ``source``, ``data``, ``preset``, ``patch``, ``batch_size``,
        ``workers``, ``compute_ms``, ``time_to_first_batch_s``, ``elapsed_s`` (all
        epochs, start-up included), ``epochs`` (one record per epoch: ``samples``,
        ``elapsed_s``, ``samples_per_s``, ``payload_mb_per_s``, ``store_mb_per_s``,
        ``data_wait_fraction``, ``payload_bytes``, ``store_bytes``, ``reads_digest``,
        and ``started_at``/``ended_at`` in Unix seconds, to line epochs up with other
        clocks such as a link's byte counters; epoch 0's rates exclude the first
        batch), the same rates over every epoch (``samples_per_s``...), ``memory_bytes`` and
        ``memory_load_s`` (``memory`` only) and ``payload_digest`` (with ``digest``).

    Raises:
        DataError: If the data path is unusable.
        FitError: On an option out of range.
    """
    try:
        config = get_preset(opts.preset)
    except ValueError as exc:
        raise FitError(str(exc)) from None
    batch_size = config.batch_size if opts.batch_size is None else opts.batch_size
    _check(opts, batch_size)
    fit_opts = FitOptions(
        data=opts.data,
        seed=opts.seed,
        epoch_size=opts.epoch_size,
        chunk_aligned=opts.chunk_aligned,
        min_live_fraction=opts.min_live_fraction,
        storage_options=opts.storage_options,
    )
    info, fit_dataset, plan = build_dataset(fit_opts, config, batch_size)
    patch = config.input_size
    t_load = time.perf_counter()
    dataset: PatchDataset
    if opts.source == "memory":
        dataset = MemoryPatchDataset(info, patch, fit_dataset.stats)
    else:
        dataset = CountedPatchDataset(info, patch, fit_dataset.stats, opts.client)
    memory_load_s = time.perf_counter() - t_load
    torch.set_num_threads(1)  # the loop only waits, counts and sleeps
    sampler = EpochSampler(plan)
    generator = torch.Generator()
    generator.manual_seed(derive_seed(opts.seed, STREAM_LOADER, 0, 0))
    loader = make_loader(dataset, sampler, batch_size, opts.workers, opts.mp_context, generator)
    compute_s = opts.compute_ms / 1000.0
    payload = hashlib.sha256() if opts.digest else None
    epochs: list[_Epoch] = []
    first_batch_s = 0.0
    t_start = time.perf_counter()
    for e in range(opts.epochs):
        sampler.set_epoch(e)
        ep = _Epoch(e, started_at=time.time())
        t_epoch = time.perf_counter()
        iterator = iter(loader)
        while True:
            t0 = time.perf_counter()
            try:
                batch, corners, nbytes = next(iterator)
            except StopIteration:
                break
            t1 = time.perf_counter()
            ep.reads.update(corners.numpy().astype("<i8").tobytes())
            n = len(corners)
            size = batch.numel() * batch.element_size()
            stored = int(nbytes.sum())
            ep.samples += n
            ep.payload_bytes += size
            ep.store_bytes += stored
            if payload is not None:
                payload.update(batch.numpy().tobytes())
            if compute_s:
                time.sleep(compute_s)
            if e == 0 and ep.samples == n:  # the run's first batch: workers starting
                first_batch_s = t1 - t_start
                continue
            ep.timed_samples += n
            ep.timed_payload += size
            ep.timed_store += stored
            ep.wait_s += t1 - t0
            ep.timed_s += time.perf_counter() - t0
        ep.elapsed_s = time.perf_counter() - t_epoch
        ep.ended_at = time.time()
        epochs.append(ep)
        r = ep.record()
        echo(
            f"epoch {e}: {ep.samples} patches in {ep.elapsed_s:.2f} s, "
            f"{r['samples_per_s']:.0f} samples/s, {r['payload_mb_per_s']:.1f} MB/s payload, "
            f"{r['store_mb_per_s']:.1f} MB/s from the store, "
            f"data wait {100 * r['data_wait_fraction']:.1f}%"
        )
    elapsed = time.perf_counter() - t_start
    del iterator, loader  # stops the persistent workers
    total = _Epoch(-1)
    for ep in epochs:
        total.timed_samples += ep.timed_samples
        total.timed_payload += ep.timed_payload
        total.timed_store += ep.timed_store
        total.wait_s += ep.wait_s
        total.timed_s += ep.timed_s
    overall = total.record()
    summary: dict[str, Any] = {
        "source": opts.source,
        "client": opts.client,
        "data": str(opts.data),
        "preset": config.name,
        "patch": list(patch),
        "batch_size": batch_size,
        "workers": opts.workers,
        "mp_context": opts.mp_context if opts.workers > 0 else None,
        "compute_ms": opts.compute_ms,
        "seed": opts.seed,
        "epoch_size": opts.epoch_size,
        "samples_per_epoch": plan.per_rank,
        "chunk_aligned": opts.chunk_aligned,
        "time_to_first_batch_s": first_batch_s,
        "elapsed_s": elapsed,
        "samples": sum(ep.samples for ep in epochs),
        **{k: overall[k] for k in ("samples_per_s", "payload_mb_per_s", "store_mb_per_s")},
        "data_wait_fraction": overall["data_wait_fraction"],
        "epochs": [ep.record() for ep in epochs],
    }
    if isinstance(dataset, MemoryPatchDataset):
        summary["memory_bytes"] = dataset.nbytes
        summary["memory_load_s"] = memory_load_s
    if payload is not None:
        summary["payload_digest"] = payload.hexdigest()
    summary = json.loads(json.dumps(summary))  # the caller sees exactly what a file would hold
    echo(
        f"{opts.source}: {summary['samples']} patches of {'x'.join(map(str, patch))} in "
        f"{elapsed:.1f} s (first batch after {first_batch_s:.2f} s): "
        f"{summary['samples_per_s']:.0f} samples/s, {summary['payload_mb_per_s']:.1f} MB/s "
        f"payload, {summary['store_mb_per_s']:.1f} MB/s from the store, data wait "
        f"{100 * summary['data_wait_fraction']:.1f}% ({opts.workers} workers, "
        f"{opts.compute_ms:g} ms compute per batch)"
    )
    return summary
