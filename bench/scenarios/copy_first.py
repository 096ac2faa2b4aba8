"""Copy-first: download the whole tree over the link, then read it locally."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from bench.copy_first import CopyError
from bench.measure import time_to_first_byte
from bench.scenarios import phases
from bench.scenarios.base import BenchError, Context, Row


class CopyFirstScenario:
    """``python -m bench.copy_first`` (HTTP, 8 connections) through the HTTP link.

    Its first byte and first batch wait for the whole copy; fio is not rerun (once
    copied, the files are local disk: see the local row).
    """

    group = "copy-first"
    rows = ("copy-first",)
    needs_hub = False
    needs_http = True

    def missing(self) -> str:
        """Needs nothing beyond Python."""
        return ""

    def run(self, ctx: Context) -> list[Row]:
        """One row, ``copy-first``.

        Raises:
            CopyError: The copy failed.
        """
        if ctx.http_sampler is None:
            raise BenchError("copy-first needs the HTTP source's link")
        sampler = ctx.http_sampler
        row = Row("copy-first", page_cache="dropped" if ctx.can_drop else "kept")
        dest = ctx.settings.work / "copy"
        shutil.rmtree(dest, ignore_errors=True)
        out = ctx.settings.work / "copy.json"
        ctx.drop()
        t0 = sampler.mark()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.copy_first",
                ctx.http_url(),
                str(dest),
                "--json",
                str(out),
            ],
            capture_output=True,
            text=True,
        )
        t1 = sampler.mark()
        if proc.returncode != 0:
            raise CopyError(proc.stderr.strip() or f"copy exited {proc.returncode}")
        copied = json.loads(out.read_text())
        copy_s = t1 - t0
        row.cold = phases.cold_record(
            ctx, sampler, t0, t1, copied["bytes"], True, files=copied["files"]
        )
        ctx.echo(
            f"    copied {copied['files']:,} files, {copied['bytes'] / 2**20:,.0f} MiB in "
            f"{copy_s:.1f} s (link use {100 * row.cold['link_utilisation']:.0f} %)"
        )
        ctx.drop()
        row.first_byte_s = copy_s + time_to_first_byte(dest / ctx.first_byte_file)
        ctx.drop()
        phases.trainer(ctx, row, dest, "cold")
        if row.trainer is not None:
            row.first_batch_s = copy_s + row.trainer["time_to_first_batch_s"]
        row.notes.append("fio not rerun: once copied, the files are local disk (see local)")
        shutil.rmtree(dest, ignore_errors=True)
        return [row]
