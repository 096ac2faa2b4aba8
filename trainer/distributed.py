"""Distributed data parallel: the rank layout, the device per rank, and the collectives.

Launched with ``torchrun`` (``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` in the
environment), each rank reads its own shard of every epoch and gradients are
averaged with DDP (gloo on CPU, nccl on CUDA). A single process (no
``WORLD_SIZE``) runs the same code with every collective a no-op. The cores a rank may
use (:func:`available_cpus`, :func:`default_threads`) and its autocast are here too.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainer.options import FitError


@dataclass(frozen=True)
class DistContext:
    """This process's place in a (possibly single-process) distributed run.

    Attributes:
        rank: Global rank.
        world_size: Number of processes.
        local_rank: Rank on this machine (selects the CUDA device).
        local_world_size: Processes on this machine (shares its cores).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1

    @property
    def enabled(self) -> bool:
        """Whether more than one process takes part."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0 (writes metrics, summary, checkpoints)."""
        return self.rank == 0


def dist_context_from_env(env: Mapping[str, str] | None = None) -> DistContext:
    """Read the rank layout ``torchrun`` puts in the environment.

    Args:
        env: Environment mapping; ``None`` for ``os.environ``.

    Returns:
        The context; a single process when ``WORLD_SIZE`` is unset.

    Raises:
        FitError: If the variables are inconsistent.
    """
    e = os.environ if env is None else env
    try:
        world = int(e.get("WORLD_SIZE", "1"))
        rank = int(e.get("RANK", "0"))
        local_rank = int(e.get("LOCAL_RANK", str(rank)))
        local_world = int(e.get("LOCAL_WORLD_SIZE", str(world)))
    except ValueError as exc:
        raise FitError(f"bad torchrun environment: {exc}") from None
    if not (world >= 1 and 0 <= rank < world and 0 <= local_rank < local_world <= world):
        raise FitError(
            f"bad torchrun environment: RANK={rank} WORLD_SIZE={world} "
            f"LOCAL_RANK={local_rank} LOCAL_WORLD_SIZE={local_world}"
        )
    return DistContext(rank, world, local_rank, local_world)


def select_device(name: str, ctx: DistContext = DistContext()) -> torch.device:
    """The device to train on.

    Args:
        name: ``"auto"`` (CUDA when available), ``"cpu"`` or ``"cuda"``.
        ctx: Distributed context; on CUDA, rank ``local_rank`` gets GPU ``local_rank``.

    Returns:
        The device.

    Raises:
        FitError: For an unknown name, or ``"cuda"`` without a CUDA device.
    """
    if name not in ("auto", "cpu", "cuda"):
        raise FitError(f"--device must be auto, cpu or cuda, not {name!r}")
    if name == "cuda" and not torch.cuda.is_available():
        raise FitError("--device cuda requested but no CUDA device is available")
    if name == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    if ctx.local_rank >= torch.cuda.device_count():
        raise FitError(
            f"local rank {ctx.local_rank} has no GPU ({torch.cuda.device_count()} visible)"
        )
    return torch.device("cuda", ctx.local_rank)


@contextlib.contextmanager
def process_group(ctx: DistContext, device: torch.device) -> Iterator[None]:
    """The process group of a distributed run for the block (nothing for one process).

    nccl on CUDA (after selecting this rank's GPU), gloo on CPU; destroyed on exit.
    """
    if ctx.enabled:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    try:
        yield
    finally:
        if ctx.enabled and dist.is_initialized():
            dist.destroy_process_group()


def wrap(model: nn.Module, ctx: DistContext, device: torch.device) -> nn.Module:
    """``model`` in :class:`DistributedDataParallel` when distributed, else itself."""
    if not ctx.enabled:
        return model
    return DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None
    )


def gather(ctx: DistContext, value: Any) -> list[Any]:
    """Every rank's ``value`` (picklable), in rank order; ``[value]`` for one process."""
    if not ctx.enabled:
        return [value]
    gathered: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(gathered, value)
    return gathered


def mean(ctx: DistContext, tensor: torch.Tensor) -> torch.Tensor:
    """The mean of ``tensor`` over ranks (a copy when distributed; ``tensor`` itself else)."""
    if not ctx.enabled:
        return tensor
    total = tensor.clone()
    dist.all_reduce(total)
    total /= ctx.world_size
    return total


def barrier(ctx: DistContext) -> None:
    """Wait for every rank (nothing for one process)."""
    if ctx.enabled:
        dist.barrier()


def available_cpus() -> int:
    """Number of CPU cores this process may run on (affinity-aware).

    Returns:
        At least 1.
    """
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def default_threads(workers: int, cpus: int | None = None) -> int:
    """Torch intra-op threads for the training process.

    DataLoader workers read and decode chunks on cores of their own, so the
    training step gets the rest, but never less than half of the cores:
    ``max(1, cpus - workers, cpus // 2)``. On 2 cores with 2 workers that is 1,
    which measured as fast as 2 and avoids OpenMP oversubscription stalls.

    Args:
        workers: DataLoader worker processes.
        cpus: Cores available; ``None`` for :func:`available_cpus`.

    Returns:
        At least 1.
    """
    n = available_cpus() if cpus is None else cpus
    return max(1, n - workers, n // 2)


def autocast(device: torch.device, enabled: bool) -> AbstractContextManager[Any]:
    """bf16 autocast on ``device`` when ``enabled`` (a no-op context otherwise).

    Args:
        device: The training device.
        enabled: Whether to autocast.

    Returns:
        A ``torch.autocast`` context.
    """
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=enabled)
