"""What every scenario of :mod:`bench.run` shares: settings, result rows, context, protocol.

A scenario is one group of table rows (``local``, ``copy-first``, ``strata``, ``rclone``,
``httpdirfs``). It says which rows it produces, why it cannot run here (a missing tool),
and runs: see :class:`Scenario`. The runner (:func:`bench.run.run_suite`) builds one
:class:`Context` (data set, links, samplers) and hands it to each selected scenario in turn.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from bench.data import Dataset
from bench.measure import LinkSampler
from bench.wan import LinkSpec, WanProxy
from deploy.local import drop_page_cache

DATASET = "bench"
"""Name of the data set published to the hub."""

LABELS = {
    "local": "local disk",
    "floor": "pyfuse3 floor (page cache dropped)",
    "copy-first": "copy-first",
    "strata-cold": "Strata cold",
    "strata-warm": "Strata warm (page cache kept)",
    "strata-warm-dropped": "Strata warm (page cache dropped)",
    "strata-cold-hints": "Strata cold + hints",
    "strata-cold-lazy": "Strata cold, background fill off",
    "strata-cold-ddp-hints": "Strata cold, 2-rank torchrun + hints",
    "rclone-cold": "rclone cold",
    "rclone-warm": "rclone warm (page cache dropped)",
    "httpdirfs-cold": "httpdirfs cold",
    "httpdirfs-warm": "httpdirfs warm (page cache dropped)",
    "epochs": "loader only, 3 epochs (local, copy-first, direct, Strata: table below)",
}
"""Every row name, with its human label for tables and plots."""


SPOKE_COUNTERS = {
    "hits": "strata_spoke_cache_hits_total",
    "misses": "strata_spoke_cache_misses_total",
    "hub_bytes": "strata_spoke_hub_fetch_bytes_total",
    "prefetch_issued_bytes": "strata_spoke_prefetch_bytes_total",
    "prefetch_used_bytes": "strata_spoke_prefetch_used_bytes_total",
    "prefetch_wasted_bytes": "strata_spoke_prefetch_wasted_bytes_total",
}
"""A row's spoke counters and the Prometheus samples they come from."""


class BenchError(RuntimeError):
    """A step of the harness failed; the message says which."""


@dataclass
class Settings:
    """Everything a run depends on (recorded in the result).

    Attributes:
        size_bytes: Size of the synthetic volume.
        link: The emulated link.
        steps: Trainer steps per run.
        workers: Trainer DataLoader workers.
        batch_size: Trainer batch size.
        fio_runtime_s: Duration of each random fio job.
        cold_cap_s: Longest a cold sequential pass may run (then it is cut short).
        groups: Scenario groups to run.
        cache_dir: Where generated data sets are kept.
        work: Working directory (hub data, caches, mounts, copies).
        drop_caches: Drop the page cache where the scenarios say so (needs root).
        trainer_rows: Rows that run the trainer; ``None`` for every row.
        trainer_repeat: Trainer runs of local disk and of warm Strata (page cache
            dropped), alternating; both rows report medians.
        quick: The small smoke-test version.
    """

    size_bytes: int
    link: LinkSpec
    steps: int
    workers: int
    batch_size: int
    fio_runtime_s: float
    cold_cap_s: float
    groups: tuple[str, ...]
    cache_dir: Path
    work: Path
    drop_caches: bool = True
    trainer_rows: frozenset[str] | None = None
    trainer_repeat: int = 1
    quick: bool = False


@dataclass
class Row:
    """One scenario's results (a line of the table)."""

    name: str
    status: str = "ok"
    reason: str = ""
    page_cache: str = ""
    first_byte_s: float | None = None
    first_batch_s: float | None = None
    trainer: dict[str, Any] | None = None
    trainer_link_bytes: int | None = None
    trainer_link_bins_mb_s: list[float] = field(default_factory=list)
    fio: dict[str, dict[str, Any]] = field(default_factory=dict)
    cold: dict[str, Any] | None = None
    spoke: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    epochs: dict[str, Any] | None = None  # the epochs group: bench.direct_stream's report

    def add_spoke(self, counts: dict[str, float]) -> None:
        """Add a phase's spoke counters (:data:`SPOKE_COUNTERS`: hits, misses, hub bytes,
        prefetch bytes issued, used and wasted) to the row's."""
        for key, value in counts.items():
            self.spoke[key] = self.spoke.get(key, 0.0) + value

    @property
    def hit_ratio(self) -> float | None:
        """Reads the spoke served from its cache, of all its reads (None: no spoke)."""
        reads = self.spoke.get("hits", 0.0) + self.spoke.get("misses", 0.0)
        return self.spoke["hits"] / reads if reads else None

    @property
    def waste_fraction(self) -> float | None:
        """Prefetched bytes evicted or dropped unread, of the bytes fetched from the hub
        (None: nothing was fetched)."""
        hub = self.spoke.get("hub_bytes", 0.0)
        return self.spoke.get("prefetch_wasted_bytes", 0.0) / hub if hub else None

    @property
    def label(self) -> str:
        """Human name for tables and plots."""
        return LABELS.get(self.name, self.name)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields, the label, hit ratio and waste fraction included."""
        return {
            "label": self.label,
            **asdict(self),
            "hit_ratio": self.hit_ratio,
            "waste_fraction": self.waste_fraction,
        }


@dataclass
class Context:
    """What the scenarios share: data, settings, links, samplers, a log function."""

    settings: Settings
    data: Dataset
    hub_link: WanProxy | None = None
    hub_sampler: LinkSampler | None = None
    http_link: WanProxy | None = None
    http_sampler: LinkSampler | None = None
    version: str = "v1"
    can_drop: bool = False
    rows: dict[str, Row] = field(default_factory=dict)
    echo: Callable[[str], None] = print

    @property
    def first_byte_file(self) -> str:
        """Relative path of the file whose first byte is timed."""
        if self.data.f3 is not None:
            return "f3.mdio/amplitude/c/0/0/0"
        return "synth.mdio/amplitude/c/0/0/0"

    @property
    def synth_bytes(self) -> int:
        """Bytes of the synthetic volume's amplitude chunks (what the cold pass reads)."""
        return sum(p.stat().st_size for p in self.data.amplitude_chunks.rglob("*") if p.is_file())

    def drop(self) -> None:
        """Drop the page cache, dentries and inodes (when permitted)."""
        if self.can_drop:
            drop_page_cache(3)

    def http_url(self) -> str:
        """The HTTP source's URL through its link.

        Raises:
            BenchError: The run started no HTTP source.
        """
        if self.http_link is None:
            raise BenchError("no HTTP source was started for this scenario")
        return f"http://{self.http_link.address}/"


class Scenario(Protocol):
    """One group of rows of the table."""

    @property
    def group(self) -> str:
        """The group's name (what ``--only`` picks)."""
        ...

    @property
    def rows(self) -> tuple[str, ...]:
        """Names of the rows it produces, in order (each a key of :data:`LABELS`)."""
        ...

    @property
    def needs_hub(self) -> bool:
        """It reads from the hub through the hub link."""
        ...

    @property
    def needs_http(self) -> bool:
        """It reads from the HTTP source through the HTTP link."""
        ...

    def missing(self) -> str:
        """Why the scenario cannot run on this machine (empty when it can)."""
        ...

    def run(self, ctx: Context) -> list[Row]:
        """Measure; returns the rows (all of :attr:`rows` unless it failed part-way).

        Raises:
            OSError, BenchError, and the errors of the tools it runs (fio, mounts, the
            trainer, the copy): the runner marks the rows not returned as failed.
        """
        ...
