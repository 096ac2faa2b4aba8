"""The figure of :mod:`bench.direct_stream` (its ``--plot``, and the ``-epochs.png`` of
:mod:`bench.report`): every row's epochs on one time axis, each epoch a segment at its
samples/s from its start to its end. It owns only the drawing; the rows and their report
are :func:`bench.direct_stream.run`'s."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.wan import format_rate


def plot(report: dict[str, Any], path: Path) -> None:
    """Samples/s of every row's epochs on one time axis (seconds since the row's first
    epoch started; epoch 0 starts with the workers), written as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4), constrained_layout=True)
    for i, (name, summary) in enumerate(report["summaries"].items()):
        epochs = summary["epochs"]
        copy_s = summary.get("copy_s", 0.0)  # copy-first: the copy comes first, 0 samples
        t0 = epochs[0]["started_at"] - copy_s
        color = f"C{i}"
        if copy_s:
            ax.hlines(1.0, 0, copy_s, color=color, linewidth=2.5, linestyle="--")
            ax.annotate("copying (0 samples/s)", (copy_s / 2, 1.0), ha="center", va="bottom",
                        fontsize=7, color=color)  # fmt: skip
        for ep in epochs:
            start, end = ep["started_at"] - t0, ep["ended_at"] - t0
            ax.hlines(ep["samples_per_s"], start, end, color=color, linewidth=2.5)
            ax.axvline(end, color=color, linewidth=0.5, linestyle=":")
        ax.plot([], [], color=color, linewidth=2.5, label=name)
    link = report["link"]
    ax.set_yscale("log")
    ax.set_xlabel(
        "seconds since the row's first epoch (copy-first: its copy) started; dotted: an epoch ends"
    )
    ax.set_ylabel("samples/s in each epoch")
    ax.set_title(
        f"{len(report['rows']) // max(1, len(report['summaries']))} epochs of the loader-only "
        f"load, {report['loader']['preset']} patches; link {link['rtt_ms']:g} ms RTT, "
        f"{format_rate(link['rate_bps'])}"
    )
    ax.legend(loc="best", fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)
