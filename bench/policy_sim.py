"""Replay access traces through every eviction policy and Belady's optimum; print hit ratios.

    python -m bench.policy_sim [--blocks N] [--epochs E] [--seed S] [--json FILE]

Traces (uniform 4 MiB blocks, so ratios are the same in blocks or bytes):

* ``scan``: one sequential pass over the dataset;
* ``loop``: the dataset read in order, again and again;
* ``shuffled epochs``: each epoch reads every block once in a new random order (how a
  training job with a shuffling sampler reads chunk files), at dataset/cache size ratios
  0.5, 1.0, 1.5 and 2.0;
* ``zipf``: independent reads with Zipf-distributed popularity (exponent 0.9 and 1.1);
* ``2 ranks in lockstep``: shuffled epochs split between two ranks (as DistributedSampler
  does) that meet every 4 reads, in any order in between; ``hinted`` gets one stream per
  rank (each rank's own plan), not the interleaved trace.

Belady's MIN (Belady, "A study of replacement algorithms for a virtual-storage computer",
IBM Systems Journal 1966) evicts the block whose next use is farthest in the future; with
uniform block sizes it is optimal, so it bounds every online policy from above.

``hinted`` is :class:`spoke.hints.HintedPolicy` over ARC, given the trace itself (or each
rank's part of it) as its read-order hint, as a training job posts its planned chunk
order to ``POST /v1/hints`` (NoPFS: Dryden et al., "Clairvoyant Prefetching for
Distributed Machine Learning I/O", SC 2021). It sees each read as the mount reports it
(``observe``) and evicts by Belady's rule; the target is ``hinted >= 0.95 x belady`` on
shuffled epochs at data/cache 1.5, with one rank and with two.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from spoke.hints import HintedPolicy
from spoke.policy import POLICIES, ARCPolicy, EvictionPolicy, make_policy

BLOCK = 4 * 1024 * 1024  # bytes; every block the same size
HINTED = "hinted"
HINT_TARGET = 0.95  # hinted / belady on shuffled epochs, data/cache 1.5
HINT_TRACE = "(data/cache 1.5)"


@dataclass(frozen=True)
class Trace:
    """A named access trace and the cache size (in blocks) to replay it with; ``streams``:
    the readers' own plans, when several readers make the trace."""

    name: str
    keys: list[int]
    cache_blocks: int
    streams: list[list[int]] | None = None


def simulate(
    policy_name: str,
    keys: Sequence[int],
    cache_blocks: int,
    streams: Sequence[Sequence[int]] | None = None,
) -> float:
    """Hit ratio of ``policy_name`` on ``keys`` with room for ``cache_blocks`` blocks.

    The policy is driven as :class:`spoke.cache.BlockCache` drives it: a hit is an access;
    a miss admits the block and then evicts (never the block just admitted) until the cache
    is within capacity. ``hinted`` gets ``keys`` as its hint (or each of ``streams`` as a
    stream of its own) and observes every read.
    """
    capacity = cache_blocks * BLOCK
    policy: EvictionPolicy
    hinted: HintedPolicy | None = None
    if policy_name == HINTED:
        policy = hinted = HintedPolicy(ARCPolicy(capacity))
        for r, plan in enumerate(streams or [keys]):
            hinted.set_hint([str(k) for k in plan], stream=f"rank{r}")
    else:
        policy = make_policy(policy_name, capacity)
    hits = 0
    for k in keys:
        key = str(k)
        if hinted is not None:
            hinted.observe(key)
        if key in policy:
            hits += 1
            policy.access(key)
            continue
        policy.insert(key, BLOCK)
        while policy.used_bytes > capacity and policy.pop_victim((key,)) is not None:
            pass
    return hits / len(keys) if keys else 0.0


def belady(keys: Sequence[int], cache_blocks: int) -> float:
    """Hit ratio of Belady's MIN on ``keys`` with room for ``cache_blocks`` blocks."""
    never = len(keys)
    next_use = [never] * len(keys)
    last: dict[int, int] = {}
    for i in range(len(keys) - 1, -1, -1):
        next_use[i] = last.get(keys[i], never)
        last[keys[i]] = i
    resident: dict[int, int] = {}  # key -> its next use
    heap: list[tuple[int, int]] = []  # (-next use, key), stale entries skipped
    hits = 0
    for i, k in enumerate(keys):
        if k in resident:
            hits += 1
        elif len(resident) >= cache_blocks:
            while True:
                neg, victim = heapq.heappop(heap)
                if resident.get(victim) == -neg:
                    del resident[victim]
                    break
        resident[k] = next_use[i]
        heapq.heappush(heap, (-next_use[i], k))
    return hits / len(keys) if keys else 0.0


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
            f"shuffled x{epochs}, 2 ranks in lockstep {HINT_TRACE}", trace, int(blocks / 1.5), plans
        )
    )
    return out


def run(blocks: int, epochs: int, seed: int) -> list[dict[str, float | str]]:
    """Every trace through every policy and MIN; one row per trace."""
    rows: list[dict[str, float | str]] = []
    for trace in traces(blocks, epochs, seed):
        row: dict[str, float | str] = {"trace": trace.name}
        for name in [*sorted(POLICIES), HINTED]:
            row[name] = simulate(name, trace.keys, trace.cache_blocks, trace.streams)
        row["belady"] = belady(trace.keys, trace.cache_blocks)
        rows.append(row)
    return rows


def markdown(rows: list[dict[str, float | str]]) -> str:
    """The rows as a markdown table of hit ratios, plus ARC − LRU in points and hinted /
    Belady."""
    names = [k for k in rows[0] if k != "trace"]
    head = "| trace | " + " | ".join(names) + " | ARC − LRU (points) | hinted / belady |"
    lines = [head, "|" + "---|" * (len(names) + 3)]
    for row in rows:
        cells = " | ".join(f"{float(row[n]):.3f}" for n in names)
        diff = 100 * (float(row["arc"]) - float(row["lru"]))
        lines.append(f"| {row['trace']} | {cells} | {diff:+.1f} | {hint_ratio(row):.3f} |")
    return "\n".join(lines)


def hint_ratio(row: dict[str, float | str]) -> float:
    """Hinted hit ratio over Belady's (1.0 when Belady hits nothing)."""
    best = float(row["belady"])
    return float(row[HINTED]) / best if best else 1.0


def main(argv: list[str] | None = None) -> int:
    """Entry point: print the table; exit 1 if ARC trails LRU by more than 1 point or hinted
    misses its target (>= 0.95 x Belady on shuffled epochs at data/cache 1.5)."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.policy_sim",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--blocks", type=int, default=2000, help="dataset size in blocks")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    ns = parser.parse_args(argv)
    rows = run(ns.blocks, ns.epochs, ns.seed)
    print(markdown(rows))
    if ns.json:
        ns.json.write_text(json.dumps(rows, indent=2) + "\n")
    worst = min(100 * (float(r["arc"]) - float(r["lru"])) for r in rows)
    if worst < -1.0:
        print(f"ARC trails LRU by {-worst:.1f} points on some trace", file=sys.stderr)
        return 1
    for row in rows:
        name = str(row["trace"])
        if name.startswith("shuffled") and HINT_TRACE in name:  # one rank and two
            ratio = hint_ratio(row)
            print(f"hinted / belady on {name}: {ratio:.3f} (target >= {HINT_TARGET})")
            if ratio < HINT_TARGET:
                print(f"hinted reaches only {ratio:.3f} x Belady on {name}", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
