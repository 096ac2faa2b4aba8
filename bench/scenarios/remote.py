"""Remote file systems over the link: Strata, rclone and httpdirfs, cold then warm.

:class:`RemoteScenario` is the measuring plan every remote file system follows;
:class:`StrataScenario` adds what only Strata has (a warm row with the page cache kept,
the alternating trainer runs against local disk, the spoke's cache counters: each row's
hit ratio and prefetch waste), and
:class:`RcloneScenario` and :class:`HttpdirfsScenario` only say how to mount.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from bench.measure import LinkSampler
from bench.mounts import HttpdirfsMount, RcloneMount, StrataMount
from bench.scenarios import phases
from bench.scenarios.base import DATASET, SPOKE_COUNTERS, BenchError, Context, Row


class Mount(Protocol):
    """A file system under test: started on an empty cache, stopped (unmounted) after."""

    mount: Path

    @property
    def pid(self) -> int | None:
        """Process id of the file system's process."""
        ...

    def start(self) -> None:
        """Mount with an empty cache."""
        ...

    def stop(self) -> None:
        """Unmount and stop (idempotent)."""
        ...


M = TypeVar("M", bound=Mount)


def fuse_missing() -> str:
    """Why no FUSE file system can be mounted here (empty when one can)."""
    if os.path.exists("/dev/fuse") and shutil.which("fusermount3") is not None:
        return ""
    return "no /dev/fuse or fusermount3"


@contextlib.contextmanager
def mounted(mount: M) -> Iterator[M]:
    """``mount`` started for the block, stopped after it (also on an error)."""
    mount.start()
    try:
        yield mount
    finally:
        mount.stop()


def cold_trainer(
    ctx: Context,
    row: Row,
    root: Path,
    sampler: LinkSampler,
    fs_pid: int | None,
    extra: tuple[str, ...] = (),
    ranks: int = 1,
) -> None:
    """The trainer on a cold cache, with the link's bytes and 1 s bins meanwhile."""
    t0 = sampler.mark()
    phases.trainer(ctx, row, root, "cold", fs_pid, extra=extra, ranks=ranks)
    t1 = sampler.mark()
    row.trainer_link_bytes = sampler.down_bytes(t0, t1)
    row.trainer_link_bins_mb_s = sampler.bins_mb_s(t0, t1)


class RemoteScenario(Generic[M]):
    """Cold and warm rows of one remote file system.

    1. fresh mount, empty cache: time to first byte, then the trainer (cold);
    2. fresh mount, empty cache again: the sequential cold pass (fio, 1 s bins);
    3. warm: the rows of :meth:`warm_extra` (none here), then with the page cache dropped
       before each measure: first byte, fio jobs, trainer, :meth:`after_warm_trainer`,
       the bytes that crossed the link meanwhile and :meth:`warm_notes`.

    Subclasses set :attr:`group` and define :meth:`new_mount` and :meth:`sampler`.
    """

    group = "remote"
    needs_hub = False
    needs_http = True

    @property
    def rows(self) -> tuple[str, ...]:
        """``<group>-cold`` and the warm row."""
        return (f"{self.group}-cold", self.warm_name)

    @property
    def warm_name(self) -> str:
        """Name of the row measured warm with the page cache dropped."""
        return f"{self.group}-warm"

    def missing(self) -> str:
        """FUSE, and the tool itself (named like the group) on ``PATH``."""
        if why := fuse_missing():
            return why
        if shutil.which(self.group) is None:
            return f"{self.group} not installed (make bench-deps)"
        return ""

    def new_mount(self, ctx: Context) -> M:
        """A mount, not yet started, with its own empty cache."""
        raise NotImplementedError

    def sampler(self, ctx: Context) -> LinkSampler:
        """The sampler of the link this file system reads through.

        Raises:
            BenchError: The run started no such link.
        """
        if ctx.http_sampler is None:
            raise BenchError(f"{self.group} needs the HTTP source's link")
        return ctx.http_sampler

    def root(self, ctx: Context, mount: M) -> Path:
        """Where the published tree appears in the mount."""
        return mount.mount

    def warm_extra(self, ctx: Context, mount: M, root: Path) -> list[Row]:
        """Warm rows measured right after the cold pass, before the page cache is dropped."""
        return []

    def after_warm_trainer(self, ctx: Context, warm: Row, mount: M, root: Path) -> None:
        """More measures of the warm row, after its trainer run."""

    def warm_notes(self, mount: M) -> list[str]:
        """Notes for the warm row, taken last."""
        return []

    def counters(self, mount: M) -> dict[str, float]:
        """The cache's counters so far (:data:`~bench.scenarios.base.SPOKE_COUNTERS`;
        none here)."""
        return {}

    @contextlib.contextmanager
    def counted(self, mount: M, row: Row) -> Iterator[None]:
        """Add what the cache counted during the block to ``row``."""
        before = self.counters(mount)
        yield
        after = self.counters(mount)
        row.add_spoke({k: v - before.get(k, 0.0) for k, v in after.items()})

    def cold_notes(self, mount: M) -> list[str]:
        """Notes for the cold row after its trainer run (none here)."""
        return []

    def run(self, ctx: Context) -> list[Row]:
        """The cold row, then the warm rows (see the class docstring)."""
        sampler = self.sampler(ctx)
        cold = Row(f"{self.group}-cold", page_cache="cold")
        rows = [cold]
        ctx.drop()
        with mounted(self.new_mount(ctx)) as mount, self.counted(mount, cold):
            root = self.root(ctx, mount)
            phases.first_byte(ctx, cold, root)
            cold_trainer(ctx, cold, root, sampler, mount.pid)
            cold.notes += self.cold_notes(mount)
        with mounted(self.new_mount(ctx)) as mount:
            root = self.root(ctx, mount)
            with self.counted(mount, cold):
                phases.cold_pass(ctx, cold, root, sampler, mount.pid)
            rows += self.warm_extra(ctx, mount, root)
            warm = Row(self.warm_name, page_cache="dropped" if ctx.can_drop else "kept")
            rows.append(warm)
            ctx.echo(f"  {warm.label}")
            t0 = sampler.mark()
            ctx.drop()
            with self.counted(mount, warm):
                phases.first_byte(ctx, warm, root)
                phases.fio_jobs(ctx, warm, root, warm.page_cache, mount.pid)
                ctx.drop()
                phases.trainer(ctx, warm, root, "warm", mount.pid)
                self.after_warm_trainer(ctx, warm, mount, root)
            warm_bytes = sampler.down_bytes(t0, sampler.mark())
            warm.notes.append(f"{warm_bytes:,} bytes over the link while warm")
            warm.notes += self.warm_notes(mount)
        return rows


class StrataScenario(RemoteScenario[StrataMount]):
    """Strata cold, warm (page cache kept) and warm (page cache dropped).

    The spoke reads from the hub through the hub link; its cache holds the whole data
    set (no eviction).
    """

    group = "strata"
    needs_hub = True
    needs_http = False

    @property
    def rows(self) -> tuple[str, ...]:
        """Cold (the spoke's defaults: background fill on), warm with the page cache kept,
        warm with it dropped, then the cold variants: with hints, with background fill off,
        2 ranks with hints."""
        return ("strata-cold", "strata-warm", self.warm_name, *COLD_VARIANTS)

    def run(self, ctx: Context) -> list[Row]:
        """The rows of :class:`RemoteScenario`, then :meth:`cold_variants`."""
        return [*super().run(ctx), *self.cold_variants(ctx)]

    def cold_variants(self, ctx: Context) -> list[Row]:
        """Each on a fresh spoke with an empty cache: the trainer posting read-order hints;
        the trainer and then (another fresh spoke) the sequential pass with background
        fill off (reads fetch only what they touch, and readahead); a 2-rank ``torchrun``
        trainer posting hints (one stream per rank)."""
        sampler = self.sampler(ctx)
        hints = Row("strata-cold-hints", page_cache="cold")
        lazy = Row("strata-cold-lazy", page_cache="cold")
        ddp = Row("strata-cold-ddp-hints", page_cache="cold")
        ctx.echo(f"  {hints.label}")
        ctx.drop()
        with mounted(self.new_mount(ctx)) as mount, self.counted(mount, hints):
            root = self.root(ctx, mount)
            hinted = ("--hints", mount.admin, "--hints-token-file", str(mount.token_file))
            cold_trainer(ctx, hints, root, sampler, mount.pid, extra=hinted)
        ctx.echo(f"  {lazy.label}")
        ctx.drop()
        with mounted(self.new_mount(ctx, LAZY_FLAGS)) as mount, self.counted(mount, lazy):
            cold_trainer(ctx, lazy, self.root(ctx, mount), sampler, mount.pid)
        with mounted(self.new_mount(ctx, LAZY_FLAGS)) as mount, self.counted(mount, lazy):
            phases.cold_pass(ctx, lazy, self.root(ctx, mount), sampler, mount.pid)
        ctx.echo(f"  {ddp.label}")
        ctx.drop()
        with mounted(self.new_mount(ctx)) as mount, self.counted(mount, ddp):
            root = self.root(ctx, mount)
            extra = ("--hints", mount.admin, "--hints-token-file", str(mount.token_file))
            cold_trainer(ctx, ddp, root, sampler, mount.pid, extra=extra, ranks=2)
        return [hints, lazy, ddp]

    @property
    def warm_name(self) -> str:
        """``strata-warm-dropped`` (``strata-warm`` keeps the page cache)."""
        return "strata-warm-dropped"

    def missing(self) -> str:
        """FUSE only: the spoke is part of this checkout."""
        return fuse_missing()

    def sampler(self, ctx: Context) -> LinkSampler:
        """The hub link's sampler.

        Raises:
            BenchError: The run started no hub.
        """
        if ctx.hub_sampler is None:
            raise BenchError("strata needs the hub's link")
        return ctx.hub_sampler

    def new_mount(self, ctx: Context, extra: tuple[str, ...] = ()) -> StrataMount:
        """A spoke whose ``--hub`` is the hub link, its cache twice the data set;
        ``extra``: more ``strata-spoke run`` flags."""
        if ctx.hub_link is None:
            raise BenchError("strata needs the hub's link")
        work = ctx.settings.work
        cache_size = f"{2 * ctx.data.bytes // 2**20 + 256}MiB"  # everything fits: no eviction
        return StrataMount(
            ctx.hub_link.address, work / "mnt-strata", work / "cache-strata", cache_size, extra
        )

    def root(self, ctx: Context, mount: StrataMount) -> Path:
        """``MOUNT/<dataset>/<version>``."""
        return mount.mount / DATASET / ctx.version

    def warm_extra(self, ctx: Context, mount: StrataMount, root: Path) -> list[Row]:
        """``strata-warm``: the page cache as the cold pass left it."""
        kept = Row("strata-warm", page_cache="kept")
        ctx.echo("  Strata warm, page cache kept")
        with self.counted(mount, kept):
            phases.first_byte(ctx, kept, root)
            phases.fio_jobs(ctx, kept, root, "kept", mount.pid)
            phases.trainer(ctx, kept, root, "warm", mount.pid)
        return [kept]

    def after_warm_trainer(self, ctx: Context, warm: Row, mount: StrataMount, root: Path) -> None:
        """The alternating trainer runs against local disk."""
        phases.repeat_warm_vs_local(ctx, warm, root, mount.pid)

    def cold_notes(self, mount: StrataMount) -> list[str]:
        """The background fill's state after the cold trainer (``GET /v1/cache``)."""
        return [f"fill after the trainer: {fill_stats(mount.admin, mount.headers)}"]

    def warm_notes(self, mount: StrataMount) -> list[str]:
        """The spoke's cache counters (``GET /v1/cache``)."""
        return [f"spoke cache: {cache_stats(mount.admin, mount.headers)}"]

    def counters(self, mount: StrataMount) -> dict[str, float]:
        """The spoke's hits, misses, hub bytes and prefetch bytes so far (``/metrics``)."""
        return spoke_counters(mount.admin, mount.headers)


COLD_VARIANTS = ("strata-cold-hints", "strata-cold-lazy", "strata-cold-ddp-hints")
"""Strata's cold rows beyond ``strata-cold``, in order."""

LAZY_FLAGS = ("--background-fill", "off")
"""The spoke's flags for the ``strata-cold-lazy`` row (its default is ``auto``)."""


def fill_stats(admin: str, headers: dict[str, str]) -> dict[str, Any]:
    """Each background fill's state and bytes from ``GET /v1/cache`` (or ``{"error"}``)."""
    import httpx

    try:
        stats: dict[str, Any] = httpx.get(f"{admin}/v1/cache", headers=headers, timeout=10).json()
    except (httpx.HTTPError, ValueError) as err:
        return {"error": str(err)}
    keys = ("state", "bytes_total", "bytes_resident", "rate_bytes_per_s")
    snaps = stats.get("fill", {}).get("snapshots", [])
    return {s["snapshot"]: {k: s.get(k) for k in keys} for s in snaps}


def spoke_counters(admin: str, headers: dict[str, str]) -> dict[str, float]:
    """:data:`~bench.scenarios.base.SPOKE_COUNTERS` from the spoke's ``/metrics`` at
    ``admin`` (``headers``: the node's admin token, which the admin port's ``/metrics``
    needs; empty when it cannot be read: the row then has no spoke figures).
    """
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = httpx.get(f"{admin}/metrics", headers=headers, timeout=10).text
    except httpx.HTTPError:
        return {}
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return {key: totals.get(name, 0.0) for key, name in SPOKE_COUNTERS.items()}


def cache_stats(admin: str, headers: dict[str, str]) -> dict[str, Any]:
    """Hits, misses, hub bytes and used bytes from the spoke's admin API at ``admin``.

    An unreachable API gives ``{"error": ...}`` (a note, not a failed row).
    """
    import httpx

    try:
        stats: dict[str, Any] = httpx.get(f"{admin}/v1/cache", headers=headers, timeout=10).json()
    except (httpx.HTTPError, ValueError) as err:
        return {"error": str(err)}
    keys = ("hits", "misses", "hub_fetch_bytes", "used_bytes")
    return {k: stats[k] for k in keys if k in stats}


class RcloneScenario(RemoteScenario[RcloneMount]):
    """``rclone mount`` with the full VFS cache, over HTTP through the link."""

    group = "rclone"

    def new_mount(self, ctx: Context) -> RcloneMount:
        """``rclone mount :http:`` of the HTTP source."""
        work = ctx.settings.work
        return RcloneMount(
            ctx.http_url(), work / "mnt-rclone", work / "cache-rclone", work / "rclone.log"
        )


class HttpdirfsScenario(RemoteScenario[HttpdirfsMount]):
    """``httpdirfs --cache``, over HTTP through the link."""

    group = "httpdirfs"

    def new_mount(self, ctx: Context) -> HttpdirfsMount:
        """``httpdirfs -f --cache`` of the HTTP source."""
        work = ctx.settings.work
        return HttpdirfsMount(
            ctx.http_url(), work / "mnt-httpdirfs", work / "cache-httpdirfs", work / "httpdirfs.log"
        )
