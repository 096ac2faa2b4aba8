"""The access traces :mod:`bench.policy_sim` replays: uniform blocks numbered from 0, read
as training jobs and their neighbours read a spoke (shuffled epochs, ranks of one job in
lockstep, a second job's Zipf hot set or one-time scan interleaved with a training job's
reads), and :func:`traces`, the standard set with the cache size each is replayed at.
It owns only how reads are ordered; replaying them through a policy is the simulator's.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

HINT_TRACE = "(data/cache 1.5)"
"""What the names of the traces that hinted's target judges (one rank and two) end with."""


@dataclass(frozen=True)
class Trace:
    """A named access trace and the cache size (in blocks) to replay it with.

    Attributes:
        streams: the hinted readers' own plans, when not the whole trace (several
            readers, or a job that posts no hint beside one that does).
        dl: a training-job trace (the default policy's target applies).
    """

    name: str
    keys: list[int]
    cache_blocks: int
    streams: list[list[int]] | None = None
    dl: bool = False


def shuffled_epochs(blocks: int, epochs: int, rng: random.Random) -> list[int]:
    """``epochs`` passes over ``range(blocks)``, each in a fresh random order."""
    out: list[int] = []
    for _ in range(epochs):
        order = list(range(blocks))
        rng.shuffle(order)
        out += order
    return out


def zipf(blocks: int, length: int, exponent: float, rng: random.Random) -> list[int]:
    """``length`` reads of ``range(blocks)`` with popularity of rank r proportional to r^-s."""
    weights = [1.0 / (r + 1) ** exponent for r in range(blocks)]
    ranks = list(range(blocks))
    rng.shuffle(ranks)  # popularity unrelated to block number
    return rng.choices(ranks, weights=weights, k=length)


def rank_plans(blocks: int, epochs: int, ranks: int, rng: random.Random) -> list[list[int]]:
    """Shuffled epochs split between ``ranks``, as DistributedSampler splits them: rank r
    reads every r-th block of each epoch's order. Returns each rank's reads in order."""
    plans: list[list[int]] = [[] for _ in range(ranks)]
    for _ in range(epochs):
        order = shuffled_epochs(blocks, 1, rng)
        for r in range(ranks):
            plans[r] += order[r::ranks]
    return plans


def lockstep_ranks(
    blocks: int, epochs: int, ranks: int, step: int, rng: random.Random
) -> tuple[list[int], list[list[int]]]:
    """:func:`rank_plans` read by ranks that meet every ``step`` reads, interleaved at
    random in between.

    Returns:
        The interleaved trace and each rank's own reads in order.
    """
    plans = rank_plans(blocks, epochs, ranks, rng)
    trace: list[int] = []
    for start in range(0, max(len(p) for p in plans), step):
        left = [list(p[start : start + step]) for p in plans]
        while any(left):
            r = rng.choice([r for r in range(ranks) if left[r]])
            trace.append(left[r].pop(0))
    return trace, plans


def interleave(a: Sequence[int], b: Sequence[int], rng: random.Random) -> list[int]:
    """Two jobs' reads merged at random, each job's own order kept (a coin per read while
    both have reads left)."""
    out: list[int] = []
    i = j = 0
    while i < len(a) or j < len(b):
        if j >= len(b) or (i < len(a) and rng.random() < 0.5):
            out.append(a[i])
            i += 1
        else:
            out.append(b[j])
            j += 1
    return out


def two_jobs(
    blocks: int, epochs: int, rng: random.Random, exponent: float = 1.0
) -> tuple[list[int], list[int]]:
    """A training job's shuffled epochs over ``range(blocks)`` beside a job reading a hot
    set of another dataset (keys from ``blocks`` on, ``blocks // 2`` of them) with Zipf
    popularity, as many reads each.

    Returns:
        The interleaved trace and the training job's own reads (its hint).
    """
    train = shuffled_epochs(blocks, epochs, rng)
    hot = [blocks + k for k in zipf(max(1, blocks // 2), len(train), exponent, rng)]
    return interleave(train, hot, rng), train


def scan_polluted(blocks: int, epochs: int, rng: random.Random) -> tuple[list[int], list[int]]:
    """A training job's shuffled epochs over ``range(blocks)`` beside a one-time scan of
    another dataset (keys from ``blocks`` on, as many as the training reads).

    Returns:
        The interleaved trace and the training job's own reads (its hint).
    """
    train = shuffled_epochs(blocks, epochs, rng)
    scan = list(range(blocks, blocks + len(train)))
    return interleave(train, scan, rng), train


def traces(blocks: int, epochs: int, seed: int) -> list[Trace]:
    """The standard trace set for a dataset of ``blocks`` blocks."""
    rng = random.Random(seed)
    half = blocks // 2
    out = [
        Trace("scan (cache = 0.5x data)", list(range(blocks)), half),
        Trace("loop x4 (data/cache 1.5)", list(range(blocks)) * 4, int(blocks / 1.5)),
    ]
    for ratio in (0.5, 1.0, 1.5, 2.0):
        out.append(
            Trace(
                f"shuffled epochs x{epochs} (data/cache {ratio})",
                shuffled_epochs(blocks, epochs, rng),
                max(1, int(blocks / ratio)),
                dl=True,
            )
        )
    for s in (0.9, 1.1):
        out.append(
            Trace(
                f"zipf s={s} (cache = 0.1x data)",
                zipf(blocks, blocks * epochs, s, rng),
                max(1, blocks // 10),
            )
        )
    trace, plans = lockstep_ranks(blocks, epochs, 2, 4, rng)
    out.append(
        Trace(
            f"shuffled x{epochs}, 2 ranks in lockstep {HINT_TRACE}",
            trace,
            int(blocks / 1.5),
            plans,
            dl=True,
        )
    )
    trace, train = two_jobs(blocks, epochs, rng)
    out.append(
        Trace(
            f"2 jobs: shuffled x{epochs} + zipf s=1.0 hot set (cache = 0.5x both)",
            trace,
            max(1, (blocks + blocks // 2) // 2),
            [train],
            dl=True,
        )
    )
    trace, train = scan_polluted(max(1, blocks // 2), epochs, rng)
    out.append(
        Trace(
            f"scan-polluted: shuffled x{epochs} (data/cache 0.5) + a one-time scan",
            trace,
            max(1, blocks),
            [train],
            dl=True,
        )
    )
    return out
