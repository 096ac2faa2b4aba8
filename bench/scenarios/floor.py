"""Python FUSE's floor: a minimal pyfuse3 passthrough of the local files (:mod:`bench.floorfs`).

Measured like the warm Strata row (page cache dropped before each measure), over the same
files as the local row, so "Strata warm ÷ floor" says how far the mount is from what any
Python FUSE file system can reach on this machine (DESIGN.md: every fio job ≥ 0.8×).
"""

from __future__ import annotations

from bench.floorfs import FloorMount
from bench.scenarios import phases
from bench.scenarios.base import Context, Row
from bench.scenarios.remote import fuse_missing


class FloorScenario:
    """The floor file system over the local source: first byte, fio jobs, trainer."""

    group = "floor"
    rows = ("floor",)
    needs_hub = False
    needs_http = False

    def missing(self) -> str:
        """FUSE only: the floor file system is part of this checkout."""
        return fuse_missing()

    def run(self, ctx: Context) -> list[Row]:
        """One row, ``floor``."""
        row = Row("floor", page_cache="dropped" if ctx.can_drop else "kept")
        work = ctx.settings.work
        with FloorMount(ctx.data.root, work / "floor-mnt", work / "floor.log") as mount:
            root = mount.mount
            ctx.drop()
            phases.first_byte(ctx, row, root)
            phases.fio_jobs(ctx, row, root, row.page_cache, mount.pid)
            ctx.drop()
            phases.trainer(ctx, row, root, "warm", mount.pid)
        return [row]
