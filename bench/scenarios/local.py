"""The co-located baseline: the source tree on this node's disk."""

from __future__ import annotations

from bench.scenarios import phases
from bench.scenarios.base import Context, Row


class LocalScenario:
    """Local disk: first byte, the fio jobs and the trainer, each after dropping the page
    cache (when permitted)."""

    group = "local"
    rows = ("local",)
    needs_hub = False
    needs_http = False

    def missing(self) -> str:
        """Local disk is always there."""
        return ""

    def run(self, ctx: Context) -> list[Row]:
        """One row, ``local``."""
        row = Row("local", page_cache="dropped" if ctx.can_drop else "kept")
        root = ctx.data.root
        ctx.drop()
        phases.first_byte(ctx, row, root)
        phases.fio_jobs(ctx, row, root, row.page_cache)
        ctx.drop()
        phases.trainer(ctx, row, root, "warm")
        return [row]
