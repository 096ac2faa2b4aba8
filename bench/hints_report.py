"""The report of :mod:`bench.hints_mount`: its table and its verdicts on the targets.

Rows are the dictionaries :func:`bench.hints_mount.compare` returns (and ``--json``
writes), so a stored run can be judged again.
"""

from __future__ import annotations

from typing import Any

from bench.policy_sim import DEFAULT_SLACK, HINTED, ONLINE
from spoke.cache.registry import DEFAULT_POLICY

MODES = (*ONLINE, HINTED)
NAMES = {"lru": "LRU", "arc": "ARC", "sieve": "SIEVE", "s3fifo": "S3-FIFO", HINTED: "hinted"}

TARGET = 0.95
"""Hinted hit ratio over Belady's where every reader posts its hint."""

SIM_SLACK = 0.03
"""Most an unhinted policy's hit ratio through the mount may trail the simulator's."""

WASTE_LIMIT = 0.05
"""Most prefetch waste (bytes evicted or dropped unread) on shuffled traces, as a share
of the bytes fetched from the hub."""


def sim_gaps(rows: list[dict[str, Any]]) -> list[tuple[float, str, str]]:
    """Points by which each unhinted policy's mount ratio trails the simulator's, per
    trace: ``(points, trace, policy)``, worst first."""
    gaps = [(100 * (r["sim"][m] - r[m]), r["trace"], m) for r in rows for m in ONLINE]
    return sorted(gaps, reverse=True)


def default_gap(row: dict[str, Any], default: str = DEFAULT_POLICY) -> float:
    """Points by which ``default`` trails the best unhinted policy on ``row``."""
    return 100 * (max(row[m] for m in ONLINE) - row[default])


def markdown(rows: list[dict[str, Any]]) -> str:
    """Rows as a markdown table of hit ratios (fetch-based), real mount (each with its
    prefetch waste: MB evicted or dropped unread, and their share of the hub bytes) and
    simulated."""
    names = " | ".join(NAMES[m] for m in MODES)
    lines = [
        f"| trace | data/cache | reads | {names} | Belady | hinted / Belady "
        f"| best − {DEFAULT_POLICY} (points) | sim {' / '.join(NAMES[m] for m in MODES)} |",
        "|" + "---|" * (len(MODES) + 7),
    ]
    for r in rows:
        sim = " / ".join(f"{r['sim'][m]:.3f}" for m in MODES)
        lockstep = f" (lockstep every {r['step_reads']} reads)" if r["step_reads"] else ""
        cells = " | ".join(
            f"{r[m]:.3f} · waste {r['runs'][m]['prefetch_wasted_bytes'] / 1e6:.1f} MB "
            f"({100 * r['waste'][m]:.1f} %)"
            for m in MODES
        )
        lines.append(
            f"| {r['trace']}{lockstep} | {r['files'] / r['cache_blocks']:.2f} | {r['reads']:,} "
            f"| {cells} | {r['belady']:.3f} | {r['hinted_over_belady']:.3f} "
            f"| {default_gap(r):.1f} | {sim} |"
        )
    return "\n".join(lines)


def best_default(rows: list[dict[str, Any]]) -> tuple[str, dict[str, float]]:
    """The unhinted policy with the highest mean hit ratio over ``rows``, and every
    policy's mean (how the spoke's default was chosen)."""
    means = {m: sum(r[m] for r in rows) / len(rows) for m in ONLINE}
    return max(means, key=lambda m: means[m]), means


def verdicts(rows: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """Each target's verdict line, and the names of the targets missed (``hinted``,
    ``default``, ``sim``, ``waste``)."""
    lines: list[str] = []
    missed: list[str] = []
    hinted_rows = [r for r in rows if r["all_hinted"]]
    if hinted_rows:
        worst = min(r["hinted_over_belady"] for r in hinted_rows)
        verdict = "met" if worst >= TARGET else "missed"
        lines.append(
            f"hinted / Belady where every reader is hinted: worst {worst:.3f} "
            f"(target >= {TARGET}: {verdict})"
        )
        if worst < TARGET:
            missed.append("hinted")
    gap = max(default_gap(r) for r in rows)
    best, means = best_default(rows)
    lines.append(
        f"default ({DEFAULT_POLICY}) trails the best unhinted policy by at most {gap:.1f} "
        f"points (target <= {DEFAULT_SLACK})"
    )
    lines.append(
        "mean hit ratio over the traces: "
        + ", ".join(f"{NAMES[m]} {means[m]:.3f}" for m in ONLINE)
        + f" (best: {NAMES[best]})"
    )
    if gap > DEFAULT_SLACK:
        missed.append("default")
    gaps = sim_gaps(rows)
    worst_gap, trace, mode = gaps[0]
    behind = [f"{NAMES[m]} on {t} ({p:.1f})" for p, t, m in gaps if p > 100 * SIM_SLACK]
    lines.append(
        f"through the mount vs the simulator: worst {worst_gap:.1f} points below "
        f"({NAMES[mode]}, {trace}) (target <= {100 * SIM_SLACK:.0f}: "
        + ("met)" if not behind else f"missed: {', '.join(behind)})")
    )
    if behind:
        missed.append("sim")
    shuffled = [r for r in rows if r["trace"].startswith("shuffled")]
    if shuffled:
        worst_waste = max(r["waste"][m] for r in shuffled for m in MODES)
        verdict = "met" if worst_waste <= WASTE_LIMIT else "missed"
        lines.append(
            f"prefetch waste on shuffled traces: worst {100 * worst_waste:.1f} % of hub bytes "
            f"(target <= {100 * WASTE_LIMIT:.0f} %: {verdict})"
        )
        if worst_waste > WASTE_LIMIT:
            missed.append("waste")
    return lines, missed
