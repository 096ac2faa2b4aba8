"""The training loop (``strata-train fit``): AdamW, warm-up + cosine, checkpoints, DDP.

One run: inspect the store, take the normalisation statistics, build the epoch
plan (:class:`trainer.plan.EpochPlan`: a fixed, seeded list of patch corners
per epoch, split into one shard per rank), then train the masked autoencoder
for ``steps`` optimiser steps, epoch after epoch.

Optimisation: AdamW (Loshchilov & Hutter 2019) with MAE's betas (0.9, 0.95) and
no weight decay on biases, norms and the mask token; the learning rate warms up
linearly and then follows a cosine decay to :data:`LR_FLOOR` of its peak
(Loshchilov & Hutter 2017, "SGDR: Stochastic Gradient Descent with Warm
Restarts", without restarts); gradients are clipped to a global norm. On CUDA
the forward pass runs under bf16 autocast (the loss stays float32). See
:mod:`trainer.schedule`.

Checkpoints (``OUT/checkpoint.pt``, written atomically, never under the data
path) hold the model, optimiser, scheduler, step and every rank's RNG states;
``--resume`` continues from one exactly: on CPU, N steps straight and N/2 +
resume + N/2 give bit-identical parameters (:mod:`trainer.checkpoint`).

Distributed data parallel: launched with ``torchrun`` (``RANK``/``WORLD_SIZE``/
``LOCAL_RANK`` in the environment), each rank reads its own shard of every
epoch and gradients are averaged with DDP (gloo on CPU, nccl on CUDA). Rank 0
writes the metrics, summary and checkpoints; every rank writes
``rank-<r>.json`` (what it read, a digest of its final parameters)
(:mod:`trainer.distributed`).

Measured per step, with ``time.perf_counter``:

* **data wait**: time blocked in ``next(loader_iterator)``, i.e. waiting for the
  next batch (the cost of the storage path; near 0 when the loader keeps up);
* **step time**: data wait plus forward, backward and optimiser step.

``data_wait_fraction`` is data wait / step time. Step 1's wait includes starting
the DataLoader workers and the first reads; it is reported separately as
``time_to_first_batch_s`` and excluded from the steady-state ``samples_per_s``
and ``data_wait_fraction`` of the summary (``*_overall`` include it)
(:mod:`trainer.report`).

:class:`Trainer` is one run on one rank: :meth:`Trainer.resume` reads and checks
the checkpoint it continues from, :meth:`Trainer.setup` builds the model,
optimiser, generators, loader and hint poster, :meth:`Trainer.step` is one
optimiser step and :meth:`Trainer.run` the loop; :func:`fit` drives it.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from trainer import distributed
from trainer.checkpoint import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_NAME,
    atomic_save,
    check_resumable,
    load_checkpoint,
    params_digest,
    rng_state,
    set_rng_state,
)
from trainer.dataloader import STREAM_LOADER, build_dataset, make_loader
from trainer.distributed import (
    DistContext,
    autocast,
    available_cpus,
    default_threads,
    dist_context_from_env,
    select_device,
)
from trainer.hints import HintPoster, default_stream, split_head
from trainer.model import MaskedAutoencoder3D
from trainer.options import FitError, FitOptions, check_out_dir, validate
from trainer.plan import STREAM_MASK, EpochSampler, derive_seed
from trainer.presets import get_preset
from trainer.readorder import epoch_read_order
from trainer.report import Measurements, MetricsLog, summary_lines, write_json
from trainer.schedule import LR_FLOOR, make_optimizer
from trainer.stats import VolumeStats

HINT_HEAD_STEPS = 8
"""Steps whose keys a hinted run posts on their own before the rest of its plan (the
first batches and the DataLoader's prefetch of the next ones)."""


class Trainer:
    """One training run on one rank.

    Args:
        opts: Run options.
        ctx: This process's place in the run.
        echo: Receives the human summary (rank 0 only; other ranks echo nothing).

    Raises:
        FitError: On invalid options or an output directory inside the data.
        DataError: If the data path is unusable.
    """

    def __init__(self, opts: FitOptions, ctx: DistContext, echo: Callable[[str], None]) -> None:
        self.opts = opts
        self.ctx = ctx
        self.echo = echo if ctx.is_main else (lambda _line: None)
        try:
            self.config = get_preset(opts.preset)
        except ValueError as exc:
            raise FitError(str(exc)) from None
        self.batch_size = self.config.batch_size if opts.batch_size is None else opts.batch_size
        validate(opts, self.batch_size)
        self.device = select_device(opts.device, ctx)
        self.amp = self.device.type == "cuda" if opts.amp is None else opts.amp
        self.info, self.dataset, self.plan = build_dataset(
            opts, self.config, self.batch_size, ctx.world_size
        )
        self.out = Path(opts.out)
        check_out_dir(opts.data, self.out)
        self.ckpt_path = self.out / CHECKPOINT_NAME
        self.peak_lr = opts.lr if opts.lr is not None else self.config.lr
        self.warmup = min(self.config.warmup_steps, max(1, opts.steps // 10))
        self.stop = opts.stop_at if opts.stop_at is not None else opts.steps
        self.global_batch = self.batch_size * ctx.world_size

    def identity(self) -> dict[str, Any]:
        """What a checkpoint must match to be resumed by this run."""
        return {
            "preset": asdict(self.config),
            "plan": self.plan.spec.to_dict(),
            "schedule": {
                "total_steps": self.opts.steps,
                "peak_lr": self.peak_lr,
                "warmup_steps": self.warmup,
                "floor": LR_FLOOR,
                "weight_decay": self.config.weight_decay,
                "clip_grad": self.opts.clip_grad,
            },
        }

    def resume(self) -> dict[str, Any] | None:
        """The checkpoint this run continues from, checked; ``None`` when not resuming.

        Also normalises exactly as the checkpointed run did (its statistics).

        Raises:
            FitError: No checkpoint, another run's, one already past ``--stop-at``, or
                one taken with another number of ranks.
        """
        if not self.opts.resume:
            return None
        ckpt = load_checkpoint(self.ckpt_path)
        check_resumable(ckpt, self.identity(), self.ckpt_path)
        if ckpt["step"] >= self.stop:
            raise FitError(
                f"checkpoint {self.ckpt_path} is at step {ckpt['step']}: nothing to do up to "
                f"step {self.stop}"
            )
        if len(ckpt["rng"]) != self.ctx.world_size:
            raise FitError(
                f"checkpoint has RNG states of {len(ckpt['rng'])} ranks, not {self.ctx.world_size}"
            )
        self.dataset.stats = VolumeStats(**ckpt["stats"])  # normalise exactly as before
        return ckpt

    def setup(self, ckpt: dict[str, Any] | None) -> None:
        """Build everything the loop needs, restored from ``ckpt`` when resuming.

        The output directory, the hint poster first (its posts of this epoch's and the
        next's read order leave on its own thread, so the cache fetches while the rest is
        built), torch threads, the model (seeded), AdamW and its schedule, the mask
        generator (one stream per rank), DDP, the epoch sampler positioned at the first
        step to run, and the DataLoader.
        """
        opts, ctx, device = self.opts, self.ctx, self.device
        self.start_step = int(ckpt["step"]) if ckpt is not None else 0
        self.out.mkdir(parents=True, exist_ok=True)
        self.epoch, offset = self.plan.locate(self.start_step + 1)
        self.poster: HintPoster | None = None
        if opts.hints is not None:  # every rank posts its own shard's order as its own stream
            base = opts.hints.stream or default_stream(self.out)
            self.poster = HintPoster(opts.hints, f"{base}.rank{ctx.rank}", self.echo)
            self._post_first(self.epoch)  # first: the cache fetches while the model is built
        self.threads = opts.threads or default_threads(
            opts.workers, max(1, available_cpus() // ctx.local_world_size)
        )
        torch.set_num_threads(self.threads)
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        torch.manual_seed(opts.seed)
        self.model = MaskedAutoencoder3D(self.config).to(device)
        self.optimizer, self.scheduler = make_optimizer(
            self.model, self.peak_lr, self.config.weight_decay, opts.steps, self.warmup
        )
        self.mask_gen = torch.Generator(device=device)
        self.mask_gen.manual_seed(derive_seed(opts.seed, STREAM_MASK, ctx.rank))
        if ckpt is not None:
            self.model.load_state_dict(ckpt["model"])
            self.optimizer.load_state_dict(ckpt["optimizer"])
            self.scheduler.load_state_dict(ckpt["scheduler"])
            set_rng_state(ckpt["rng"][ctx.rank], self.mask_gen, device)
        self.net: nn.Module = distributed.wrap(self.model, ctx, device)

        self.sampler = EpochSampler(self.plan, ctx.rank)
        self.sampler.set_epoch(self.epoch, offset)
        loader_gen = torch.Generator()
        loader_gen.manual_seed(derive_seed(opts.seed, STREAM_LOADER, ctx.rank, self.epoch))
        self.loader: DataLoader[Any] | None = make_loader(
            self.dataset,
            self.sampler,
            self.batch_size,
            opts.workers,
            opts.mp_context,
            loader_gen,
            pin_memory=device.type == "cuda",
        )

    def _read_order(self, epoch: int, steps: int | None = None) -> list[str]:
        return epoch_read_order(self.plan, self.info, epoch, self.ctx.rank, steps=steps)

    def _post_first(self, epoch: int) -> None:
        """Queue the hint posts of a run's start (on the poster's thread, so nothing here
        waits for them): the first :data:`HINT_HEAD_STEPS` steps' keys of ``epoch`` (the
        stream's new plan), the rest of the epoch, then the next epoch, so the cache
        always sees ahead."""
        poster = self.poster
        assert poster is not None
        head: list[str] = []

        def first_steps() -> list[str]:
            head[:] = self._read_order(epoch, steps=HINT_HEAD_STEPS)
            return head

        poster.post_later(first_steps, append=False)
        poster.post_later(lambda: split_head(self._read_order(epoch), head)[1], append=True)
        poster.post_later(lambda: self._read_order(epoch + 1), append=True)

    def save(self, step: int) -> None:
        """Write the checkpoint after ``step`` (every rank's RNG state; rank 0 writes)."""
        states = distributed.gather(self.ctx, rng_state(self.mask_gen, self.device))
        if self.ctx.is_main:
            atomic_save(
                {
                    "format": CHECKPOINT_FORMAT,
                    "step": step,
                    "model": self.model.state_dict(),
                    "optimizer": self.optimizer.state_dict(),
                    "scheduler": self.scheduler.state_dict(),
                    "rng": states,
                    "stats": asdict(self.dataset.stats),
                    "volume": self.info.public(),
                    "data": str(self.opts.data),
                    **self.identity(),
                },
                self.ckpt_path,
            )

    def step(self, step: int, batch: torch.Tensor) -> tuple[float, float]:
        """One optimiser step on ``batch``.

        Returns:
            The loss averaged over ranks (synchronised with the device) and the
            learning rate the step used.

        Raises:
            FitError: The loss is not finite.
        """
        lr = float(self.optimizer.param_groups[0]["lr"])
        x = batch.to(self.device, non_blocking=True)
        with autocast(self.device, self.amp):
            loss = self.net(x, generator=self.mask_gen).loss
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.opts.clip_grad > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.opts.clip_grad)
        self.optimizer.step()
        self.scheduler.step()
        loss_value = float(distributed.mean(self.ctx, loss.detach().float()))
        if not math.isfinite(loss_value):
            raise FitError(f"loss became non-finite ({loss_value}) at step {step}")
        return loss_value, lr

    def run(self) -> dict[str, Any]:
        """Resume (when asked), set up, train to the stop step; returns the summary.

        Writes the metrics, checkpoints, the summary (rank 0) and, distributed, each
        rank's ``rank-<r>.json``. See :func:`fit` for the summary's fields.
        """
        self.setup(self.resume())
        opts, ctx = self.opts, self.ctx
        start_step, loader = self.start_step, self.loader
        assert loader is not None
        measured = Measurements()
        self.model.train()
        metrics_path = self.out / "metrics.jsonl" if ctx.is_main else None
        metrics = MetricsLog(metrics_path, start_step, self.global_batch)
        try:
            t_start = time.perf_counter()
            iterator: Iterator[Any] = iter(loader)
            for step in range(start_step + 1, self.stop + 1):
                t0 = t_start if step == start_step + 1 else time.perf_counter()
                try:
                    batch, corners = next(iterator)
                except StopIteration:
                    self.epoch += 1
                    self.sampler.set_epoch(self.epoch, 0)
                    if self.poster is not None:  # on its thread: the loop goes on at once
                        upcoming = functools.partial(self._read_order, self.epoch + 1)
                        self.poster.post_later(upcoming, append=True)
                    iterator = iter(loader)
                    batch, corners = next(iterator)
                t1 = time.perf_counter()
                if step == start_step + 1:
                    measured.time_to_first_batch_s = t1 - t_start
                measured.add_reads(corners.numpy())
                loss_value, lr = self.step(step, batch)
                t2 = time.perf_counter()
                measured.add_step(loss_value, t1 - t0, t2 - t0)
                metrics.add(loss_value, t1 - t0, t2 - t0)
                if step % opts.log_every == 0 or step == self.stop:
                    metrics.write(step, self.epoch, lr, t2 - t_start)
                last = step == self.stop
                if opts.checkpoint and (
                    last or (opts.checkpoint_every and step % opts.checkpoint_every == 0)
                ):
                    self.save(step)
            elapsed = time.perf_counter() - t_start
        finally:
            metrics.close()
            if self.poster is not None:
                self.poster.close()
        del iterator, loader
        self.loader = None  # stops persistent workers
        return self._finish(measured, elapsed)

    def _finish(self, measured: Measurements, elapsed: float) -> dict[str, Any]:
        opts, ctx, info, stats = self.opts, self.ctx, self.info, self.dataset.stats
        steps_run = self.stop - self.start_step
        digest = params_digest(self.model)
        totals = measured.totals(steps_run, self.global_batch, elapsed)
        summary: dict[str, Any] = {
            "steps": steps_run,
            "start_step": self.start_step,
            "end_step": self.stop,
            "total_steps": opts.steps,
            "resumed": opts.resume,
            "batch_size": self.batch_size,
            "world_size": ctx.world_size,
            **totals,
            "data": str(opts.data),
            "volume": {
                "variable": info.variable,
                "trace_mask": info.mask_variable,
                "shape": list(info.shape),
                "chunks": list(info.chunks),
                "dtype": info.dtype,
                "mean": stats.mean,
                "std": stats.std,
                "clip_sigma": stats.clip,
                "scale": stats.scale,
                "stats_source": stats.source,
            },
            "plan": self.plan.spec.to_dict(),
            "steps_per_epoch": self.plan.steps_per_epoch,
            "preset": asdict(self.config),
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "params_digest": digest,
            "epochs_started": self.epoch + 1,
            "epoch_size": opts.epoch_size,
            "workers": opts.workers,
            "mp_context": opts.mp_context if opts.workers > 0 else None,
            "threads": self.threads,
            "device": str(self.device),
            "amp": "bf16" if self.amp else None,
            "seed": opts.seed,
            "lr": self.peak_lr,
            "warmup_steps": self.warmup,
            "checkpoint": str(self.ckpt_path) if opts.checkpoint else None,
        }
        summary = json.loads(json.dumps(summary))  # the caller sees exactly what the file holds
        if ctx.enabled:
            write_json(
                self.out / f"rank-{ctx.rank}.json",
                {
                    "rank": ctx.rank,
                    "world_size": ctx.world_size,
                    "first_step": self.start_step + 1,
                    "last_step": self.stop,
                    "reads": measured.read_count,
                    "read_digest": measured.read_digest,
                    "params_digest": digest,
                },
            )
        if ctx.is_main:
            write_json(self.out / "summary.json", summary)
            patch = "x".join(map(str, self.config.input_size))
            for line in summary_lines(summary, patch, self.threads, self.amp):
                self.echo(line)
            self.echo(f"wrote {self.out / 'summary.json'} and {self.out / 'metrics.jsonl'}")
        distributed.barrier(ctx)  # every rank's files are complete when the launcher returns
        return summary


def fit(opts: FitOptions, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Train the masked autoencoder and write metrics, summary and checkpoints.

    Rank 0 writes ``opts.out/metrics.jsonl`` (one JSON object per logged step:
    ``step``, ``epoch``, ``loss`` (mean over the steps since the previous line,
    averaged over ranks), ``lr``, ``samples_per_s`` (all ranks),
    ``data_wait_fraction``, ``data_wait_s``, ``step_time_s``, ``elapsed_s``),
    ``opts.out/summary.json`` (the returned dictionary) and
    ``opts.out/checkpoint.pt``. In a distributed run every rank also writes
    ``opts.out/rank-<r>.json``.

    Args:
        opts: Run options.
        echo: Receives the short human summary, line by line (rank 0 only).

    Returns:
        The summary: ``steps`` (run by this invocation), ``start_step``,
        ``end_step``, ``total_steps``, ``batch_size`` (per rank), ``world_size``,
        ``samples``, ``elapsed_s`` (wall time of the loop, first batch included),
        ``samples_per_s`` and ``data_wait_fraction`` (steady state: steps after
        the first), ``samples_per_s_overall``, ``data_wait_fraction_overall``,
        ``loss_first``, ``loss_last``, ``loss_first10_mean``, ``loss_last10_mean``,
        ``time_to_first_batch_s``, ``data`` (the path) and run details.

    Raises:
        DataError: If the data path is unusable (missing, not a store, volume
            smaller than a patch, no live data).
        FitError: On invalid options, an output directory inside the data, a
            checkpoint that does not match the run, or a non-finite loss.
    """
    ctx = dist_context_from_env()
    trainer = Trainer(opts, ctx, echo)
    with distributed.process_group(ctx, trainer.device):
        return trainer.run()
