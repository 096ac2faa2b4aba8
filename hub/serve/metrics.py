"""The hub's Prometheus metrics (served by :mod:`hub.serve.metricsendpoint`).

Names follow Prometheus conventions (``strata_hub_`` prefix, base units, ``_total`` for
counters; https://prometheus.io/docs/practices/naming/).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from hub.auth import tokenstore
from hub.catalog import Catalog
from hub.catalog.events import Event, EventKind
from hub.errors import HubError
from strata_local.expiry import certificate_not_after

logger = logging.getLogger(__name__)

PUBLISH_BUCKETS = (0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, float("inf"))
"""Histogram buckets of publish durations, seconds (from a tiny tree to a large one)."""


class HubMetrics:
    """The hub's counters, in their own registry.

    Attributes:
        registry: The registry holding the counters (what ``/metrics`` exposes).
        requests: ``strata_hub_requests_total{method,code}``: gRPC calls finished, by
            method name and gRPC status code name (``OK``, ``NOT_FOUND``, …).
        blocks_served: ``strata_hub_blocks_served_total``: blocks sent by ReadBlocks.
        bulk_bytes: ``strata_hub_bulk_bytes_total``: block bytes sent on the bulk channel.
        bulk_connections: ``strata_hub_bulk_connections``: bulk connections open.
        handshakes_waiting: ``strata_hub_handshakes_waiting{port}``: connections whose
            first message is whole waiting for their handshake's turn
            (:mod:`strata_local.handshakes`), at the ``grpc`` port's door and the
            ``bulk`` port's.
        handshake_rate: ``strata_hub_handshake_rate{port}``: handshakes a door begins a
            second at most now (the rate its machine is found to afford).
        known_callers: ``strata_hub_known_callers``: addresses that proved a token
            within the hour, whose handshakes go first (kept in the data directory
            across a restart: :mod:`strata_local.knownhosts`).
        blocks_served_bytes: ``strata_hub_blocks_served_bytes_total``: block bytes sent
            by ReadBlocks.
        active_streams: ``strata_hub_active_streams{method}``: streaming calls in flight.
        publish_duration: ``strata_hub_publish_duration_seconds``: how long publishes took,
            from their start to their commit, as seen in the catalog's events (publishes
            by any process, committed while this server runs).
        limit_refusals: ``strata_hub_limit_refusals_total{limit}``: calls refused for a
            token's share (:mod:`hub.limits.budget`, :class:`hub.auth.grants.GrantLimiter`):
            ``streams`` (ReadBlocks streams per token), ``bytes`` (no room in the read
            budget within the wait), ``grants`` (IssueGrant beyond the token's grants),
            ``request`` (a request message not received within its deadline).
        read_bytes_held: ``strata_hub_read_bytes_held``: block bytes charged to ReadBlocks
            streams now (:class:`hub.limits.budget.ReadBudget`; read at scrape time).
        read_bytes_stalled: ``strata_hub_read_bytes_stalled``: bytes of messages that
            stalled ReadBlocks streams left in gRPC core, charged to their tokens out of the
            hub's total (:meth:`hub.limits.budget.ReadBudget.take_stalled`).
        events: ``strata_hub_catalog_events_total{kind}``: catalog events seen.
        catalog_up: ``strata_hub_catalog_up``: 1 while the catalog answers the watcher's
            polls (:class:`hub.serve.watch.CatalogWatcher`), 0 while its engine is unreachable;
            ``/readyz`` on the metrics port answers 503 while it is 0.
        metrics_connections_closed: ``strata_hub_metrics_connections_closed_total{reason}``:
            connections to the metrics endpoint (:mod:`hub.serve.metricsendpoint`) closed
            unserved or cut off: ``limit`` (refused as it arrived, the cap reached with no
            connection to displace), ``displaced`` (waiting for its request when one arrived
            at the cap), ``timeout`` (request not sent within its deadline), ``stalled``
            (answer not taken by the client within the send timeout).

    Catalog sizes (``strata_hub_catalog_*``) are read at scrape time once
    :meth:`watch_catalog` names the catalog.

    Args:
        registry: Where to register the counters; a new registry by default.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.requests = Counter(
            "strata_hub_requests",
            "gRPC calls finished, by method and status code.",
            ["method", "code"],
            registry=self.registry,
        )
        self.blocks_served = Counter(
            "strata_hub_blocks_served",
            "Blocks sent by ReadBlocks.",
            registry=self.registry,
        )
        self.blocks_served_bytes = Counter(
            "strata_hub_blocks_served_bytes",
            "Block bytes sent by ReadBlocks.",
            registry=self.registry,
        )
        self.bulk_bytes = Counter(
            "strata_hub_bulk_bytes",
            "Block bytes sent on the bulk channel (hub/serve/bulk.py; also in "
            "blocks_served_bytes).",
            registry=self.registry,
        )
        self.bulk_connections = Gauge(
            "strata_hub_bulk_connections",
            "Bulk channel connections open.",
            registry=self.registry,
        )
        self.handshakes_waiting = Gauge(
            "strata_hub_handshakes_waiting",
            "Connections waiting for their handshake's turn, by port (grpc, bulk).",
            ["port"],
            registry=self.registry,
        )
        self.handshake_rate = Gauge(
            "strata_hub_handshake_rate",
            "Handshakes a port's door begins a second at most now, by port (grpc, bulk).",
            ["port"],
            registry=self.registry,
        )
        self.known_callers = Gauge(
            "strata_hub_known_callers",
            "Addresses that proved a token within the hour (their handshakes go first).",
            registry=self.registry,
        )
        self.active_streams = Gauge(
            "strata_hub_active_streams",
            "Streaming gRPC calls in flight, by method.",
            ["method"],
            registry=self.registry,
        )
        self.limit_refusals = Counter(
            "strata_hub_limit_refusals",
            "Calls refused for a token's share, by limit (streams, bytes, grants, request).",
            ["limit"],
            registry=self.registry,
        )
        self.read_bytes_held = Gauge(
            "strata_hub_read_bytes_held",
            "Block bytes held for ReadBlocks streams (charged to the read budget).",
            registry=self.registry,
        )
        self.read_bytes_stalled = Gauge(
            "strata_hub_read_bytes_stalled",
            "Bytes of messages stalled ReadBlocks streams left in gRPC core until their "
            "clients read, cancel or go away (--stall-timeout).",
            registry=self.registry,
        )
        self.publish_duration = Histogram(
            "strata_hub_publish_duration_seconds",
            "Publish duration from start to commit, seconds.",
            buckets=PUBLISH_BUCKETS,
            registry=self.registry,
        )
        self.events = Counter(
            "strata_hub_catalog_events",
            "Catalog events seen by this server, by kind.",
            ["kind"],
            registry=self.registry,
        )
        self.catalog_up = Gauge(
            "strata_hub_catalog_up",
            "1 while the catalog answered this server's last poll, 0 while it does not.",
            registry=self.registry,
        )
        self.catalog_up.set(1)
        self.catalog_reachable = True
        self.metrics_connections_closed = Counter(
            "strata_hub_metrics_connections_closed",
            "Connections to the metrics endpoint closed unserved or cut off, by reason (limit: "
            "refused at the cap; displaced: made room for a newcomer at the cap while waiting "
            "for its request; timeout: request not sent within its deadline; stalled: answer "
            "not taken within the send timeout).",
            ["reason"],
            registry=self.registry,
        )

    def set_catalog_up(self, up: bool) -> None:
        """Records whether the catalog answers (``strata_hub_catalog_up``, ``/readyz``)."""
        self.catalog_reachable = up
        self.catalog_up.set(1 if up else 0)

    def observe_events(self, events: Iterable[Event]) -> None:
        """Counts catalog events and records the duration of each publish among them."""
        for event in events:
            self.events.labels(kind=event.kind.name.lower()).inc()
            if event.kind == EventKind.VERSION_PUBLISHED:
                self.publish_duration.observe(event.duration_ns / 1e9)

    def watch_catalog(self, catalog: Catalog) -> Callable[[], None]:
        """Exposes ``catalog``'s sizes as ``strata_hub_catalog_*`` gauges, read per scrape.

        Returns:
            A function that stops exposing them (call it before closing the catalog).
        """
        collector = _CatalogCollector(catalog)
        self.registry.register(collector)
        return lambda: self.registry.unregister(collector)

    def watch_expiry(self, tokens: Path | None, certificate: Path | None) -> Callable[[], None]:
        """Exposes when the tokens and the serving certificate expire
        (:class:`ExpiryCollector`), read per scrape.

        Returns:
            A function that stops exposing them.
        """
        collector = ExpiryCollector(tokens, certificate)
        self.registry.register(collector)
        return lambda: self.registry.unregister(collector)


class ExpiryCollector(Collector):
    """``strata_hub_token_expiry_timestamp_seconds{token}`` (each managed token with an
    expiry, :func:`hub.auth.tokenstore.entries`) and
    ``strata_hub_certificate_expiry_timestamp_seconds`` (the serving certificate), read from
    the files at each scrape.

    Args:
        tokens: the token file (None: no tokens).
        certificate: the serving certificate (None: no TLS).
    """

    def __init__(self, tokens: Path | None, certificate: Path | None) -> None:
        self.tokens = tokens
        self.certificate = certificate

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """The two gauges (a family without samples when there is nothing to say)."""
        tokens = GaugeMetricFamily(
            "strata_hub_token_expiry_timestamp_seconds",
            "When each managed token expires, seconds since the epoch (tokens without an "
            "expiry are left out)",
            labels=["token"],
        )
        if self.tokens is not None:
            try:
                entries = tokenstore.entries(self.tokens)
            except (HubError, OSError, ValueError):  # unreadable now: serve keeps the last
                entries = []
            for entry in entries:
                if entry.expires is not None:
                    tokens.add_metric([entry.id], entry.expires.timestamp())
        yield tokens
        cert = GaugeMetricFamily(
            "strata_hub_certificate_expiry_timestamp_seconds",
            "When the hub's serving certificate expires, seconds since the epoch",
        )
        if self.certificate is not None:
            not_after = certificate_not_after(self.certificate)
            if not_after is not None:
                cert.add_metric([], not_after)
        yield cert


class _CatalogCollector(Collector):
    """Catalog sizes as gauges, read at scrape time (LMDB: its statistics, cheap; PostgreSQL:
    a count per database)."""

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            stats = self._catalog.stats()
        except HubError:  # closed during shutdown
            return
        gauges = (
            ("datasets", "Datasets in the catalog.", stats.datasets),
            ("tags", "Tags in the catalog.", stats.tags),
            ("snapshots", "Distinct snapshots with a live version.", stats.snapshots),
            ("blocks", "Distinct blocks referenced by live versions.", stats.blocks),
            ("block_bytes", "Bytes of the blocks live versions reference.", stats.block_bytes),
            (
                "publishes_in_progress",
                "Publishes staged and not committed (or abandoned by a crash).",
                stats.publishes_in_progress,
            ),
            ("last_sequence", "Sequence number of the newest event.", stats.last_sequence),
            (
                "map_used_bytes",
                "Bytes the catalog takes (LMDB map in use, or its PostgreSQL table).",
                stats.map_used_bytes,
            ),
        )
        for name, documentation, value in gauges:
            yield GaugeMetricFamily(f"strata_hub_catalog_{name}", documentation, value=value)
        versions = GaugeMetricFamily(
            "strata_hub_catalog_versions", "Versions by state.", labels=["state"]
        )
        versions.add_metric(["live"], stats.versions - stats.revoked_versions)
        versions.add_metric(["revoked"], stats.revoked_versions)
        yield versions
