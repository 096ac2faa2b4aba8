"""The hub's Prometheus metrics and their HTTP endpoint.

Names follow Prometheus conventions (``strata_hub_`` prefix, base units, ``_total`` for
counters; https://prometheus.io/docs/practices/naming/).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from wsgiref.simple_server import WSGIServer

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from hub.address import Address
from hub.catalog import Catalog
from hub.errors import HubError, ListenError
from hub.events import Event, EventKind

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
        blocks_served_bytes: ``strata_hub_blocks_served_bytes_total``: block bytes sent
            by ReadBlocks.
        active_streams: ``strata_hub_active_streams{method}``: streaming calls in flight.
        publish_duration: ``strata_hub_publish_duration_seconds``: how long publishes took,
            from their start to their commit, as seen in the catalog's events (publishes
            by any process, committed while this server runs).
        events: ``strata_hub_catalog_events_total{kind}``: catalog events seen.

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
        self.active_streams = Gauge(
            "strata_hub_active_streams",
            "Streaming gRPC calls in flight, by method.",
            ["method"],
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


class _CatalogCollector(Collector):
    """Catalog sizes as gauges, read from LMDB's statistics at scrape time (cheap)."""

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
            ("map_used_bytes", "Bytes of the LMDB map in use.", stats.map_used_bytes),
        )
        for name, documentation, value in gauges:
            yield GaugeMetricFamily(f"strata_hub_catalog_{name}", documentation, value=value)
        versions = GaugeMetricFamily(
            "strata_hub_catalog_versions", "Versions by state.", labels=["state"]
        )
        versions.add_metric(["live"], stats.versions - stats.revoked_versions)
        versions.add_metric(["revoked"], stats.revoked_versions)
        yield versions


class MetricsEndpoint:
    """An HTTP server exposing a registry in the Prometheus text format, on its own thread.

    Use :meth:`start`; stop with :meth:`close`.
    """

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        self.address = Address(str(server.server_address[0]), int(server.server_port))

    @classmethod
    def start(cls, listen: str, registry: CollectorRegistry) -> MetricsEndpoint:
        """Starts serving ``registry`` on ``listen``.

        Args:
            listen: ``HOST:PORT``; port 0 picks a free port.
            registry: The metrics to expose.

        Returns:
            The running endpoint; ``address`` holds the bound port.

        Raises:
            InvalidArgument: ``listen`` is malformed.
            ListenError: The address cannot be bound (in use, not local).
        """
        address = Address.parse(listen)
        try:
            server, thread = prometheus_client.start_http_server(
                address.port, addr=address.host, registry=registry
            )
        except OSError as exc:
            raise ListenError(f"cannot serve metrics on {listen}: {exc.strerror or exc}") from exc
        return cls(server, thread)

    def close(self) -> None:
        """Stops the server and waits for its thread."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
