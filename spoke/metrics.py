"""Prometheus metrics of the spoke daemon (names from DESIGN.md, base units).

Module-level collectors in the default registry: one daemon per process.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from strata_local.expiry import certificate_not_after

CACHE_HITS = Counter("strata_spoke_cache_hits", "Block reads served from the spoke's disk cache")
CACHE_MISSES = Counter("strata_spoke_cache_misses", "Block reads that needed a hub fetch")
HUB_BULK_BYTES = Counter(
    "strata_spoke_hub_bulk_bytes",
    "Block bytes received from the hub over its bulk channel (--hub-bulk-port; the rest of "
    "strata_spoke_hub_fetch_bytes_total came over gRPC)",
)
HUB_FETCH_BYTES = Counter(
    "strata_spoke_hub_fetch_bytes", "Block bytes received from the hub (not from peers)"
)
HUB_FETCH_BLOCKS = Counter("strata_spoke_hub_fetch_blocks", "Blocks received from the hub")
HUB_FETCH_SECONDS = Histogram(
    "strata_spoke_hub_fetch_seconds",
    "Duration of one ReadBlocks stream to the hub, seconds",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
HUB_FETCH_ERRORS = Counter(
    "strata_spoke_hub_fetch_errors", "Failed hub fetch attempts (retried)", ["code"]
)
CACHE_USED_BYTES = Gauge("strata_spoke_cache_used_bytes", "Bytes of blocks in the cache")
CACHE_CAPACITY_BYTES = Gauge("strata_spoke_cache_capacity_bytes", "Configured cache size")
CACHE_BLOCKS = Gauge("strata_spoke_cache_blocks", "Blocks in the cache")
EVICTIONS = Counter("strata_spoke_evictions", "Blocks evicted from the cache")
EVICTED_BYTES = Counter("strata_spoke_evicted_bytes", "Bytes evicted from the cache")
READ_ERRORS = Counter(
    "strata_spoke_read_errors",
    "Reads and opens the mount answered with EIO (a miss that failed, a block it could not "
    "read), as its hit reports tell them",
)
TENANT_RESIDENT_BYTES = Gauge(
    "strata_spoke_tenant_resident_bytes",
    "Bytes of resident blocks each tenant's datasets hold (--tenants)",
    ["tenant"],
)
TENANT_ADMITTED_BYTES = Counter(
    "strata_spoke_tenant_admitted_bytes",
    "Bytes admitted to the cache for each tenant's datasets (--tenants), for chargeback",
    ["tenant"],
)
TENANT_READS = Counter(
    "strata_spoke_tenant_reads",
    "Block reads of each tenant's datasets by outcome (hit or miss; --tenants)",
    ["tenant", "outcome"],
)
CORRUPT_BLOCKS = Counter(
    "strata_spoke_corrupt_blocks", "Blocks whose bytes did not match their digest"
)
INFLIGHT_FETCHES = Gauge("strata_spoke_inflight_fetches", "Blocks being fetched from the hub")
HUB_UP = Gauge("strata_spoke_hub_up", "1 when the last hub call succeeded, else 0")
PINNED_BYTES = Gauge("strata_spoke_pinned_bytes", "Bytes of cached blocks held by pins")
ARC_TARGET_BYTES = Gauge(
    "strata_spoke_arc_target_bytes", "ARC's adaptive target size p for its T1 list, bytes"
)
CACHE_FULL = Counter(
    "strata_spoke_cache_full",
    "Admissions refused because the cache disk was full and nothing was evictable",
)
STREAMED_THROUGH = Counter(
    "strata_spoke_streamed_through_blocks",
    "Blocks served to readers without caching them (cache full, everything pinned)",
)
PREFETCH_BYTES = Counter(
    "strata_spoke_prefetch_bytes", "Bytes of blocks fetched ahead of reads (issued)"
)
PREFETCH_USED_BYTES = Counter(
    "strata_spoke_prefetch_used_bytes", "Prefetched bytes that a reader then read"
)
PREFETCH_WASTED_BYTES = Counter(
    "strata_spoke_prefetch_wasted_bytes", "Prefetched bytes evicted before anyone read them"
)
PREFETCH_SOURCE_BYTES = Counter(
    "strata_spoke_prefetch_source_bytes",
    "Prefetch bytes by source (hint, readahead, crossfile, fill) and outcome: requested, "
    "dropped (the source's window was full or off), refused (no room, or the budget), "
    "issued (cached), used (read), wasted (evicted or discarded unread)",
    ["source", "outcome"],
)
PREFETCH_WINDOW = Gauge(
    "strata_spoke_prefetch_window_bytes",
    "Bytes a prefetch source may have outstanding (0: off until a reader confirms it)",
    ["source"],
)
WATCH_SEQUENCE = Gauge(
    "strata_spoke_watch_sequence", "Last hub catalog event applied by invalidation"
)
MANIFEST_MISMATCHES = Counter(
    "strata_spoke_manifest_mismatches",
    "Manifests from the hub refused because they did not hash to their snapshot id",
)
INVALID_MANIFESTS = Counter(
    "strata_spoke_invalid_manifests",
    "Manifests refused because an entry's path makes no tree the hub would publish "
    "('..', empty components, NUL, a name twice, entries inside a file)",
)
SIGNATURE_REFUSALS = Counter(
    "strata_spoke_signature_refusals",
    "Snapshots refused because they were unsigned or their publisher signature did not verify",
)
SNAPSHOT_MISMATCHES = Counter(
    "strata_spoke_snapshot_mismatches",
    "Snapshots refused because their dataset or version was not the one asked for",
)
HUB_CREDENTIAL_RELOADS = Counter(
    "strata_spoke_hub_credential_reloads",
    "Hub credentials re-read after their files changed (what: tls or token)",
    ["what"],
)
LOST_BLOCKS = Counter(
    "strata_spoke_lost_blocks",
    "Blocks the index held whose file was gone from the cache disk (dropped and refetched)",
)


class MountRestarts(Collector):
    """``strata_spoke_mount_restarts_total``: remounts of a mount that died,
    ``strata_spoke_mount_handovers_total``: successors that resumed its connection instead,
    and ``strata_spoke_successions_total``: new spokes (``--take-over``) that took the
    connection over from the one before, as counted by the supervisors of this cache
    directory (``CACHE_DIR/mount-restarts``, ``mount-handovers``, ``successions``), read at
    each scrape so the counts survive daemon and supervisor restarts."""

    def __init__(self) -> None:
        self.path: Path | None = None

    def _count(self, name: str) -> int:
        if self.path is None:
            return 0
        try:
            return int(self.path.with_name(name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return 0

    def collect(self) -> Iterator[CounterMetricFamily]:
        """One sample each: the count in its file (0 when it is missing or unreadable)."""
        yield CounterMetricFamily(
            "strata_spoke_mount_restarts",
            "Times the supervisor remounted a mount process that died",
            value=self._count("mount-restarts"),
        )
        yield CounterMetricFamily(
            "strata_spoke_mount_handovers",
            "Times a new mount process resumed the FUSE connection of one that died or was "
            "upgraded (no remount)",
            value=self._count("mount-handovers"),
        )
        yield CounterMetricFamily(
            "strata_spoke_successions",
            "Times a new spoke (--take-over) took over the FUSE connection, cache and mount "
            "of the one serving this cache dir (no remount)",
            value=self._count("successions"),
        )


MOUNT_RESTARTS = MountRestarts()
REGISTRY.register(MOUNT_RESTARTS)


class CertificateExpiry(Collector):
    """``strata_spoke_certificate_expiry_timestamp_seconds{use}``: when each certificate
    the daemon presents expires (``hub-client``: ``--hub-cert``; ``peer``:
    ``--peer-cert``), read from its file at each scrape, so a renewal shows at once."""

    def __init__(self) -> None:
        self.paths: dict[str, Path] = {}

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """One sample per certificate that is set and readable."""
        family = GaugeMetricFamily(
            "strata_spoke_certificate_expiry_timestamp_seconds",
            "When a certificate the spoke presents expires, seconds since the epoch",
            labels=["use"],
        )
        for use, path in sorted(self.paths.items()):
            not_after = certificate_not_after(path)
            if not_after is not None:
                family.add_metric([use], not_after)
        yield family


CERTIFICATES = CertificateExpiry()
REGISTRY.register(CERTIFICATES)
QUEUE_DEPTH = Gauge(
    "strata_spoke_fetch_queue_depth", "Blocks queued for a fetch, by request class", ["class"]
)
QUEUED_BYTES = Gauge(
    "strata_spoke_fetch_queued_bytes", "Bytes queued for a fetch, by request class", ["class"]
)
INFLIGHT_BYTES = Gauge(
    "strata_spoke_fetch_inflight_bytes", "Bytes asked of the source and not yet arrived"
)
WINDOW_BYTES = Gauge(
    "strata_spoke_fetch_window_bytes", "Bytes the scheduler keeps on the wire (rate × RTT)"
)
CLASS_BYTES = Counter(
    "strata_spoke_fetch_bytes",
    "Bytes fetched, by the request class they left as",
    ["class"],
)
LINK_RATE = Gauge("strata_spoke_link_rate_bytes_per_second", "Measured delivery rate, bytes/s")
LINK_RTT = Gauge("strata_spoke_link_rtt_seconds", "Smallest recent round trip to the source")
DEMAND_MISS_SECONDS = Histogram(
    "strata_spoke_demand_miss_seconds",
    "Time a reader waited for missing blocks (one EnsureBlocks with a miss), seconds",
    buckets=(0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2, 5, 10, 30, 60),
)
FILL_BYTES = Counter("strata_spoke_fill_bytes", "Bytes background fill made resident")
FILL_REMAINING_BYTES = Gauge(
    "strata_spoke_fill_remaining_bytes", "Bytes of snapshots being filled not yet resident"
)
FILL_RATE = Gauge(
    "strata_spoke_fill_rate_bytes_per_second", "Average rate of the current background fill"
)
STEADY_STATE_SECONDS = Gauge(
    "strata_spoke_steady_state_seconds",
    "From the first read of a cold phase to the first 5 s of reads with at most 1 % misses",
)
ADMIN_CONNECTIONS_CLOSED = Counter(
    "strata_spoke_admin_connections_closed",
    "Admin API connections the daemon closed unserved, by reason: limit (as they arrived, "
    "with the most open), displaced (owing a request or answers longest, for one arriving "
    "with the most open), timeout (no whole request within the request timeout), stalled (a "
    "response left unread within the write-stall timeout), slow (answers owed longer than "
    "the write-stall timeout and taken below the response rate floor)",
    ["reason"],
)
