"""Replay access traces through every eviction policy and Belady's optimum; print hit ratios.

    python -m bench.policy_sim [--blocks N] [--epochs E] [--seed S] [--json FILE]

Policies: LRU, ARC (Megiddo & Modha, FAST 2003), SIEVE (Zhang et al., NSDI 2024) and
S3-FIFO (Yang et al., SOSP 2023), all byte-weighted as the spoke runs them, plus
``hinted`` and Belady's MIN. Traces (:mod:`bench.traces`; uniform 4 MiB blocks, so ratios
are the same in blocks or bytes); the ones marked DL are what training jobs do to a spoke:

* ``scan``: one sequential pass over the dataset;
* ``loop``: the dataset read in order, again and again;
* ``shuffled epochs`` (DL): each epoch reads every block once in a new random order (how
  a training job with a shuffling sampler reads chunk files), at dataset/cache size
  ratios 0.5, 1.0, 1.5 and 2.0;
* ``zipf``: independent reads with Zipf-distributed popularity (exponent 0.9 and 1.1);
* ``2 ranks in lockstep`` (DL): shuffled epochs split between two ranks (as
  DistributedSampler does) that meet every 4 reads, in any order in between; ``hinted``
  gets one stream per rank (each rank's own plan), not the interleaved trace;
* ``2 jobs`` (DL): two datasets on one spoke, read at the same time: a training job
  reading one in shuffled epochs and a job reading a hot set of the other (half its size)
  with Zipf popularity (s = 1.0), as many reads each, interleaved at random; the cache
  holds half of the two. Only the training job posts a hint;
* ``scan-polluted`` (DL): shuffled epochs over a dataset half the cache, while another
  job scans a different dataset once, as many reads as the training job's, interleaved
  at random. Only the training job posts a hint.

Belady's MIN (Belady, "A study of replacement algorithms for a virtual-storage computer",
IBM Systems Journal 1966) evicts the block whose next use is farthest in the future; with
uniform block sizes it is optimal, so it bounds every online policy from above.

``hinted`` is :class:`spoke.cache.hinted.HintedPolicy` over the default policy, given the trace
itself (or each hinted reader's part of it) as its read-order hint, as a training job
posts its planned chunk order to ``POST /v1/hints`` (NoPFS: Dryden et al., "Clairvoyant
Prefetching for Distributed Machine Learning I/O", SC 2021). It sees each read as the
mount reports it (``observe``) and evicts by Belady's rule.

On the traces where a job posts no hint (``2 jobs``, ``scan-polluted``) the table adds that
job's own hit ratio under ``hinted`` and under the default policy: ``hinted`` keeps, for
blocks no hint mentions, what the wrapped policy alone would keep (see
:mod:`spoke.cache.hinted`).

Targets (the exit status): hinted >= 0.95 x Belady on shuffled epochs at data/cache 1.5,
with one rank and with two; hinted >= the default policy on every trace where a job posts
no hint, for both jobs together and for the unhinted job alone; ARC within 1 point of LRU
or better everywhere; the default policy within 1 point of the best of LRU, ARC, SIEVE and
S3-FIFO on every DL trace.
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from bench.traces import HINT_TRACE, Trace, traces
from spoke.cache.hinted import HintedPolicy
from spoke.cache.policy import EvictionPolicy
from spoke.cache.registry import DEFAULT_POLICY, make_policy

BLOCK = 4 * 1024 * 1024  # bytes; every block the same size
HINTED = "hinted"
HINT_TARGET = 0.95  # hinted / belady on shuffled epochs, data/cache 1.5
ONLINE = ("lru", "arc", "sieve", "s3fifo")  # the policies a spoke can run, table order
DEFAULT_SLACK = 1.0  # points the default may trail the best online policy on DL traces


def simulate(
    policy_name: str,
    keys: Sequence[int],
    cache_blocks: int,
    streams: Sequence[Sequence[int]] | None = None,
    inner: str = DEFAULT_POLICY,
) -> float:
    """Hit ratio of ``policy_name`` on ``keys`` with room for ``cache_blocks`` blocks
    (:func:`replay`'s hits over the reads)."""
    hits = replay(policy_name, keys, cache_blocks, streams, inner)
    return sum(hits) / len(keys) if keys else 0.0


def unhinted_ratio(
    policy_name: str,
    keys: Sequence[int],
    cache_blocks: int,
    streams: Sequence[Sequence[int]],
    inner: str = DEFAULT_POLICY,
) -> float:
    """Hit ratio of the reads of blocks no stream mentions (the job that posts no hint)
    when ``policy_name`` replays the whole trace (1.0 when there are none)."""
    hinted = {k for plan in streams for k in plan}
    hits = replay(policy_name, keys, cache_blocks, streams, inner)
    mine = [hit for k, hit in zip(keys, hits, strict=True) if k not in hinted]
    return sum(mine) / len(mine) if mine else 1.0


def replay(
    policy_name: str,
    keys: Sequence[int],
    cache_blocks: int,
    streams: Sequence[Sequence[int]] | None = None,
    inner: str = DEFAULT_POLICY,
) -> list[bool]:
    """Whether each read of ``keys`` hits ``policy_name`` with room for ``cache_blocks``
    blocks.

    The policy is driven as :class:`spoke.cache.blockcache.BlockCache` drives it: a hit is an
    access; a miss admits the block and then evicts (never the block just admitted) until the cache
    is within capacity. ``hinted`` (over ``inner``, the default policy unless told) gets
    ``keys`` as its hint (or each of ``streams`` as a stream of its own) and observes every
    read.

    Raises:
        ValueError: unknown policy name.
    """
    capacity = cache_blocks * BLOCK
    policy: EvictionPolicy
    hinted: HintedPolicy | None = None
    if policy_name == HINTED:
        policy = hinted = HintedPolicy(make_policy(inner, capacity))
        for r, plan in enumerate(streams or [keys]):
            hinted.set_hint([str(k) for k in plan], stream=f"rank{r}")
    else:
        policy = make_policy(policy_name, capacity)
    hits: list[bool] = []
    for k in keys:
        key = str(k)
        if hinted is not None:
            hinted.observe(key)
        hits.append(key in policy)
        if hits[-1]:
            policy.access(key)
            continue
        policy.insert(key, BLOCK)
        while policy.used_bytes > capacity and policy.pop_victim((key,)) is not None:
            pass
    return hits


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


def mixed(trace: Trace) -> bool:
    """True when some reads are of blocks no stream mentions (a job that posts no hint)."""
    if trace.streams is None:
        return False
    hinted = {k for plan in trace.streams for k in plan}
    return any(k not in hinted for k in trace.keys)


def run(blocks: int, epochs: int, seed: int) -> list[dict[str, float | str | bool]]:
    """Every trace through every policy and MIN; one row per trace (``dl``: whether the
    default's target applies; ``mixed``: whether a job posts no hint, and then that job's
    own hit ratio under the default policy and under ``hinted``, ``unhinted:NAME``)."""
    rows: list[dict[str, float | str | bool]] = []
    for trace in traces(blocks, epochs, seed):
        row: dict[str, float | str | bool] = {
            "trace": trace.name,
            "dl": trace.dl,
            "mixed": mixed(trace),
        }
        for name in [*ONLINE, HINTED]:
            row[name] = simulate(name, trace.keys, trace.cache_blocks, trace.streams)
        row["belady"] = belady(trace.keys, trace.cache_blocks)
        if row["mixed"] and trace.streams is not None:
            for name in (DEFAULT_POLICY, HINTED):
                row[f"unhinted:{name}"] = unhinted_ratio(
                    name, trace.keys, trace.cache_blocks, trace.streams
                )
        rows.append(row)
    return rows


def mixed_gap(row: dict[str, float | str | bool]) -> float:
    """Points by which ``hinted`` trails the default policy on a mixed trace, for both jobs
    or for the one that posts no hint, whichever is worse (<= 0: it never trails)."""
    if not row.get("mixed"):
        return 0.0
    both = float(row[DEFAULT_POLICY]) - float(row[HINTED])
    alone = float(row[f"unhinted:{DEFAULT_POLICY}"]) - float(row[f"unhinted:{HINTED}"])
    return 100 * max(both, alone)


def default_gap(row: dict[str, float | str | bool], default: str = DEFAULT_POLICY) -> float:
    """Points by which ``default`` trails the best online policy on ``row`` (<= 0: none)."""
    return 100 * (max(float(row[n]) for n in ONLINE) - float(row[default]))


def markdown(rows: list[dict[str, float | str | bool]]) -> str:
    """The rows as a markdown table of hit ratios, plus ARC − LRU in points, how far the
    default trails the best online policy (points) and hinted / Belady."""
    names = [*ONLINE, HINTED, "belady"]
    head = (
        "| trace | DL | "
        + " | ".join(names)
        + f" | ARC − LRU (points) | best − {DEFAULT_POLICY} (points) | hinted / belady "
        + f"| unhinted job: hinted / {DEFAULT_POLICY} |"
    )
    lines = [head, "|" + "---|" * (len(names) + 6)]
    for row in rows:
        cells = " | ".join(f"{float(row[n]):.3f}" for n in names)
        diff = 100 * (float(row["arc"]) - float(row["lru"]))
        dl = "yes" if row["dl"] else ""
        alone = ""
        if row.get("mixed"):
            alone = (
                f"{float(row[f'unhinted:{HINTED}']):.3f} / "
                f"{float(row[f'unhinted:{DEFAULT_POLICY}']):.3f}"
            )
        lines.append(
            f"| {row['trace']} | {dl} | {cells} | {diff:+.1f} | {default_gap(row):.1f} "
            f"| {hint_ratio(row):.3f} | {alone} |"
        )
    return "\n".join(lines)


def hint_ratio(row: dict[str, float | str | bool]) -> float:
    """Hinted hit ratio over Belady's (1.0 when Belady hits nothing)."""
    best = float(row["belady"])
    return float(row[HINTED]) / best if best else 1.0


def main(argv: list[str] | None = None) -> int:
    """Entry point: print the table and a verdict per target; exit 0 (with ``--strict``:
    1 if ARC trails LRU by more than 1 point, the default trails the best online policy
    by more than 1 point on a DL trace, hinted misses >= 0.95 x Belady on shuffled
    epochs at data/cache 1.5, or hinted trails the default where a job posts no hint)."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.policy_sim",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--blocks", type=int, default=2000, help="dataset size in blocks")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    ns = parser.parse_args(argv)
    if ns.blocks < 2 or ns.epochs < 1:
        parser.error("need --blocks >= 2 and --epochs >= 1")
    rows = run(ns.blocks, ns.epochs, ns.seed)
    print(markdown(rows))
    if ns.json:
        ns.json.write_text(json.dumps(rows, indent=2) + "\n")
    missed = []
    worst = min(100 * (float(r["arc"]) - float(r["lru"])) for r in rows)
    print(f"ARC − LRU: worst {worst:+.1f} points (target >= -1.0)")
    if worst < -1.0:
        missed.append("ARC >= LRU")
    for row in rows:
        gap = default_gap(row)
        if row["dl"] and gap > DEFAULT_SLACK:
            print(
                f"default ({DEFAULT_POLICY}) trails the best by {gap:.1f} points on {row['trace']}"
            )
            missed.append(f"default on {row['trace']}")
        name = str(row["trace"])
        if name.startswith("shuffled") and HINT_TRACE in name:  # one rank and two
            ratio = hint_ratio(row)
            print(f"hinted / belady on {name}: {ratio:.3f} (target >= {HINT_TARGET})")
            if ratio < HINT_TARGET:
                missed.append(f"hinted on {name}")
        if row.get("mixed"):
            gap = mixed_gap(row)
            both = 100 * (float(row[HINTED]) - float(row[DEFAULT_POLICY]))
            alone = 100 * (
                float(row[f"unhinted:{HINTED}"]) - float(row[f"unhinted:{DEFAULT_POLICY}"])
            )
            print(
                f"hinted − {DEFAULT_POLICY} on {name}: {both:+.1f} points for both jobs, "
                f"{alone:+.1f} for the one that posts no hint (target >= 0 each)"
            )
            if gap > 0:
                missed.append(f"hinted >= {DEFAULT_POLICY} on {name}")
    gaps = [default_gap(r) for r in rows if r["dl"]]
    print(
        f"default ({DEFAULT_POLICY}): trails the best online policy on a DL trace by at most "
        f"{max(gaps):.1f} points (target <= {DEFAULT_SLACK})"
    )
    print("targets: " + ("all met" if not missed else "missed: " + "; ".join(missed)))
    return 1 if ns.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
