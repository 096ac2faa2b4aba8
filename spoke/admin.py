"""The spoke's admin API (FastAPI): health, readiness, cache statistics and metrics.

Prewarm jobs, pins, hints and evict come with the prefetch work (DESIGN.md, "Admin API").
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn
from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from pydantic import BaseModel

from spoke.cache import BlockCache
from spoke.fetcher import Fetcher


class CacheStats(BaseModel):
    """``GET /v1/cache``: sizes in bytes, counts exact."""

    capacity_bytes: int
    used_bytes: int
    blocks: int
    inflight_fetches: int
    hits: int
    misses: int
    hit_ratio: float
    hub_fetch_bytes: int
    hub: str
    hub_up: bool


def _sample(name: str) -> float:
    value = REGISTRY.get_sample_value(name)
    return 0.0 if value is None else value


def create_app(cache: BlockCache, fetcher: Fetcher) -> FastAPI:
    """Build the admin app over a running cache and fetcher."""
    app = FastAPI(title="Strata spoke admin API", version="1")

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        """Liveness: the daemon's event loop answers."""
        return {"status": "ok"}

    @app.get("/readyz", responses={503: {"description": "not ready"}})
    def readyz() -> Any:
        """Ready when the hub answered its last call or the cache can serve offline."""
        hub_up = _sample("strata_spoke_hub_up") == 1.0
        if hub_up or len(cache.policy) > 0:
            return {"status": "ready", "hub_up": hub_up}
        return JSONResponse(
            status_code=503,
            content={
                "status": "not ready",
                "detail": f"hub {fetcher.hub.target} unreachable and the cache is empty",
            },
        )

    @app.get("/v1/cache", response_model=CacheStats)
    def cache_stats() -> CacheStats:
        """Cache size, use, hit ratio and hub traffic."""
        hits = int(_sample("strata_spoke_cache_hits_total"))
        misses = int(_sample("strata_spoke_cache_misses_total"))
        return CacheStats(
            capacity_bytes=cache.capacity_bytes,
            used_bytes=cache.used_bytes,
            blocks=len(cache.policy),
            inflight_fetches=fetcher.inflight,
            hits=hits,
            misses=misses,
            hit_ratio=hits / (hits + misses) if hits + misses else 0.0,
            hub_fetch_bytes=int(_sample("strata_spoke_hub_fetch_bytes_total")),
            hub=fetcher.hub.target,
            hub_up=_sample("strata_spoke_hub_up") == 1.0,
        )

    @app.get("/metrics")
    def metrics() -> Response:
        """Prometheus exposition of every ``strata_spoke_`` metric."""
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    return app


class AdminServer(uvicorn.Server):
    """uvicorn on a socket we bound ourselves, leaving signal handling to the daemon."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """The daemon owns SIGINT/SIGTERM; uvicorn must not install handlers."""
        yield


def bind(listen: str) -> socket.socket:
    """Bind a TCP listening socket for ``HOST:PORT`` (port 0 picks a free port).

    Raises:
        ValueError: ``listen`` is not HOST:PORT.
        OSError: the address is in use or not local.
    """
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"admin address must be HOST:PORT, got {listen!r}")
    host = host.strip("[]") or "127.0.0.1"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, int(port)))
    except OSError:
        sock.close()
        raise
    sock.listen(128)
    sock.set_inheritable(True)
    return sock
