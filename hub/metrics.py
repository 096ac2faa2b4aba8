"""The hub's Prometheus metrics and their HTTP endpoint.

Names follow Prometheus conventions (``strata_hub_`` prefix, base units, ``_total`` for
counters; https://prometheus.io/docs/practices/naming/).
"""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIServer

import prometheus_client
from prometheus_client import CollectorRegistry, Counter

from hub.address import Address
from hub.errors import ListenError


class HubMetrics:
    """The hub's counters, in their own registry.

    Attributes:
        registry: The registry holding the counters (what ``/metrics`` exposes).
        requests: ``strata_hub_requests_total{method,code}``: gRPC calls finished, by
            method name and gRPC status code name (``OK``, ``NOT_FOUND``, …).
        blocks_served: ``strata_hub_blocks_served_total``: blocks sent by ReadBlocks.
        blocks_served_bytes: ``strata_hub_blocks_served_bytes_total``: block bytes sent
            by ReadBlocks.

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
