"""The workload of :mod:`bench.hints_mount`: which datasets it publishes and who reads
what, in which order. :func:`scenarios` builds its traces (shuffled epochs per reader
count, and the two mixes where a second job shares the spoke), :func:`make_files` writes a
dataset's one-block files, :func:`epoch_orders` gives each reader its shard of every
epoch and :func:`path_of` a file's path in the snapshot. Reading them through a mount and
counting what the spoke fetched is the benchmark's own.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from pathlib import Path

from bench.traces import rank_plans, zipf

MIN_CACHE_BLOCKS = 8
"""Smaller caches are all watermark rounding (a 2-block cache holds 1 between evictions)."""

DATASET = "hints"  # the training job's dataset
OTHER = "other"  # the second job's dataset in the mixes
MIXES = ("2-jobs", "scan")


@dataclass(frozen=True)
class Reader:
    """One reading thread: a dataset, the files it reads in order, whether it posts them
    as a hint stream in the hinted run."""

    dataset: str
    order: list[int]
    hinted: bool = True


@dataclass(frozen=True)
class Scenario:
    """One trace: datasets (name -> one-block files), the cache, the readers, and how
    often the readers meet (0: never; DDP ranks meet at every step)."""

    name: str
    files: dict[str, int]
    cache_blocks: int
    readers: list[Reader]
    step: int = 0

    def key(self, dataset: str, i: int) -> int:
        """A file's key in traces over every dataset (datasets numbered one after another)."""
        offset = 0
        for name, count in self.files.items():
            if name == dataset:
                return offset + i
            offset += count
        raise KeyError(dataset)


def scenarios(
    files: int,
    cache_blocks: int,
    epochs: int,
    reader_counts: list[int],
    step: int,
    seed: int,
    mixes: list[str],
) -> list[Scenario]:
    """The traces :func:`bench.hints_mount.main` runs: shuffled epochs per reader count, then
    ``mixes``.

    Raises:
        ValueError: an unknown mix name.
    """
    out = [
        Scenario(
            f"shuffled x{epochs}, {n} reader{'s' if n > 1 else ''}",
            {DATASET: files},
            cache_blocks,
            [Reader(DATASET, o) for o in epoch_orders(files, epochs, n, seed)],
            step if n > 1 else 0,
        )
        for n in reader_counts
    ]
    rng = random.Random(seed + 1)
    for mix in mixes:
        if mix == "2-jobs":
            train = epoch_orders(files, epochs, 1, seed)[0]
            hot = zipf(max(1, files // 2), len(train), 1.0, rng)
            out.append(
                Scenario(
                    f"2 jobs: shuffled x{epochs} + zipf hot set",
                    {DATASET: files, OTHER: max(1, files // 2)},
                    max(MIN_CACHE_BLOCKS, (files + files // 2) // 2),
                    [Reader(DATASET, train), Reader(OTHER, hot, hinted=False)],
                    step,
                )
            )
        elif mix == "scan":
            small = max(1, cache_blocks // 2)
            train = epoch_orders(small, epochs, 1, seed)[0]
            out.append(
                Scenario(
                    f"scan-polluted: shuffled x{epochs} + a one-time scan",
                    {DATASET: small, OTHER: len(train)},
                    cache_blocks,
                    [Reader(DATASET, train), Reader(OTHER, list(range(len(train))), False)],
                    step,
                )
            )
        else:
            raise ValueError(f"unknown mix {mix!r} (choose: {', '.join(MIXES)})")
    return out


def make_files(src: Path, files: int, block: int, seed: int) -> dict[int, str]:
    """``files`` random one-block files under ``src/train``; returns index -> sha256."""
    rng = random.Random(seed)
    (src / "train").mkdir(parents=True)
    digests = {}
    for i in range(files):
        data = rng.randbytes(block)
        (src / "train" / f"f{i:05d}.bin").write_bytes(data)
        digests[i] = hashlib.sha256(data).hexdigest()
    return digests


def epoch_orders(files: int, epochs: int, readers: int, seed: int) -> list[list[int]]:
    """Per reader, its reads over ``epochs`` shuffled epochs (reader r takes every r-th
    file of each epoch's order, as DistributedSampler does)."""
    return rank_plans(files, epochs, readers, random.Random(seed))


def path_of(i: int) -> str:
    """A file's path in the snapshot."""
    return f"train/f{i:05d}.bin"
