"""docs/design.md's speed targets, each with what a run of :mod:`bench.run` measured.

Goals, not assertions: a target not met is reported (``met: false``), never raised; one
that could not be measured has ``met: null``.
"""

from __future__ import annotations

import statistics
from typing import Any

from bench import fio
from bench.scenarios.base import Row
from bench.scenarios.epochs import targets as epoch_targets
from bench.wan import LinkSpec


def _get(rows: dict[str, Row], name: str) -> Row | None:
    row = rows.get(name)
    return row if row is not None and row.status == "ok" else None


def _fio_mb_s(row: Row | None, job: str) -> float | None:
    if row is None or job not in row.fio:
        return None
    value: float = row.fio[job]["mb_s"]
    return value


def targets(rows: dict[str, Row], link: LinkSpec) -> list[dict[str, Any]]:
    """The targets with what this run measured.

    Args:
        rows: The run's rows by name.
        link: The emulated link (named in the link-use target).

    Returns:
        One ``{"name", "goal", "measured", "met"}`` per target, in docs/design.md's order.
    """
    out: list[dict[str, Any]] = []

    def add(name: str, goal: str, measured: str, met: bool | None) -> None:
        out.append({"name": name, "goal": goal, "measured": measured, "met": met})

    local, warm = _get(rows, "local"), _get(rows, "strata-warm-dropped")
    cold, copy = _get(rows, "strata-cold"), _get(rows, "copy-first")
    lseq, wseq = _fio_mb_s(local, "seq_1m"), _fio_mb_s(warm, "seq_1m")
    if lseq and wseq is not None:
        r = wseq / lseq
        add("warm seq read vs local (page cache dropped)", "≥ 0.75×", f"{r:.2f}×", r >= 0.75)
    else:
        add("warm seq read vs local (page cache dropped)", "≥ 0.75×", "not measured", None)
    if local and warm and local.trainer and warm.trainer:
        r = warm.trainer["samples_per_s"] / local.trainer["samples_per_s"]
        add("trainer samples/s, warm vs local", "≥ 0.98×", f"{r:.2f}×", r >= 0.98)
        dw = warm.trainer["data_wait_fraction"] - local.trainer["data_wait_fraction"]
        add("data-wait fraction, warm − local", "≤ +1 point", f"{100 * dw:+.1f} points", dw <= 0.01)
    else:
        add("trainer samples/s, warm vs local", "≥ 0.98×", "not measured", None)
    if cold and cold.first_batch_s is not None:
        base = 0.0  # local disk's start-up (median over its runs): not the file system's
        if local and local.trainer:
            base = statistics.median(r["time_to_first_batch_s"] for r in local.trainer["runs"])
        extra = cold.first_batch_s - base
        text = f"{cold.first_batch_s:.2f} s ({extra:+.2f} s vs local's {base:.2f} s)"
        if copy and copy.first_batch_s is not None:
            text += f"; copy-first {copy.first_batch_s:.1f} s"
        add("cold first batch (beyond local's start-up)", "≤ 2 s", text, extra <= 2.0)
    if cold and cold.cold:
        u = cold.cold["link_utilisation"]
        add(f"cold link use ({link.describe()})", "≥ 80 %", f"{100 * u:.0f} %", u >= 0.8)
    floor = _get(rows, "floor")
    if warm is not None and floor is not None:
        ratios = {j: (_fio_mb_s(warm, j), _fio_mb_s(floor, j)) for j in fio.JOBS}
        shown = {j: a / b for j, (a, b) in ratios.items() if a is not None and b}
        if shown:
            add(
                "Strata warm vs the pyfuse3 floor, every fio job",
                "≥ 0.8×",
                ", ".join(f"{j} {r:.2f}×" for j, r in shown.items()),
                min(shown.values()) >= 0.8,
            )
    if local and local.trainer and cold and cold.trainer:
        dw = cold.trainer["data_wait_fraction"] - local.trainer["data_wait_fraction"]
        add(
            "cold (defaults): data wait − local",
            "≤ +3 points",
            f"{100 * dw:+.1f} points",
            dw <= 0.03,
        )
        snapshot_s = (cold.trainer_link_bytes or 0) * 8 / link.rate_bps
        bound = 1.2 * max(local.trainer["wall_s"], snapshot_s)
        took = cold.trainer["wall_s"]
        add(
            "cold (defaults): trainer wall time",
            "≤ 1.2 × max(local, bytes ÷ link)",
            f"{took:.1f} s (bound {bound:.1f} s)",
            took <= bound,
        )
    hinted = _get(rows, "strata-cold-hints")
    if local and local.trainer and hinted and hinted.trainer:
        dw = hinted.trainer["data_wait_fraction"] - local.trainer["data_wait_fraction"]
        add("cold + hints: data wait − local", "≤ +3 points", f"{100 * dw:+.1f} points", dw <= 0.03)
        r = hinted.trainer["wall_s"] / local.trainer["wall_s"]
        add("cold + hints: trainer wall time vs local", "≤ 1.15×", f"{r:.2f}×", r <= 1.15)
        if hinted.first_batch_s is not None:
            base = statistics.median(r["time_to_first_batch_s"] for r in local.trainer["runs"])
            extra = hinted.first_batch_s - base
            add(
                "cold + hints: first batch − local",
                "≤ +1 s",
                f"{hinted.first_batch_s:.2f} s ({extra:+.2f} s)",
                extra <= 1.0,
            )
        if cold and cold.trainer:
            took, filled = hinted.trainer["wall_s"], cold.trainer["wall_s"]
            add(
                "cold + hints: trainer wall time vs cold (fill on)",
                "≤ 1×",
                f"{took:.1f} s vs {filled:.1f} s",
                took <= filled,
            )
    spoke_rows = [r for r in rows.values() if r.status == "ok" and r.waste_fraction is not None]
    if spoke_rows:
        worst = max(spoke_rows, key=lambda r: r.waste_fraction or 0.0)
        w = worst.waste_fraction or 0.0
        add(
            "Strata prefetch waste (evicted or dropped unread), every row",
            "≤ 5 % of hub bytes",
            f"{100 * w:.1f} % ({worst.label})",
            w <= 0.05,
        )
    for other in ("rclone-warm", "httpdirfs-warm"):
        row = _get(rows, other)
        if warm is None or row is None:
            continue
        worse = []
        parts = []
        for job in fio.JOBS:
            a, b = _fio_mb_s(warm, job), _fio_mb_s(row, job)
            if a is None or b is None:
                continue
            parts.append(f"{job} {a / b:.2f}×" if b else f"{job} –")
            if a < b:
                worse.append(job)
        if parts:
            add(f"Strata warm ≥ {other} on every fio job", "≥ 1×", ", ".join(parts), not worse)
    loader = _get(rows, "epochs")
    if loader is not None and loader.epochs:  # issue 41's, only where the group ran
        out += epoch_targets(loader.epochs)
    return out
