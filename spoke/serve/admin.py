"""The spoke's admin API (FastAPI, OpenAPI at ``/docs``), put together from the routers in
:mod:`spoke.serve.routes`.

``/healthz``, ``/readyz`` and ``/docs`` are open (probes); every ``/v1/`` route needs
``Authorization: Bearer <token>`` when the daemon has a token file, and ``/metrics`` (every
tenant's usage) the node-wide token, not a scoped one, checked by
:class:`~spoke.serve.adminguard.AdminGuard`, which the daemon serves this app behind;
Prometheus scrapes :func:`create_metrics_app` on ``--metrics`` instead, no token. Domain
errors map to HTTP statuses here and nowhere else, always with a JSON body
``{"detail": "..."}``: unknown dataset, ref, job or pin → 404; a request that is well formed
but names something invalid (a ``..`` glob, a path that is not in the snapshot) → 400;
a malformed body (FastAPI's own validation) → 422 with its list of problems;
a pin that cannot fit → 409; a dataset the hub token may not read → 403; a manifest that
does not hash to its snapshot id → 502; hub unreachable (or refusing this spoke's token or
certificate) with nothing usable cached → 503.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse

from spoke.cache.blockcache import BlockCache
from spoke.catalog.catalog import SnapshotCatalog
from spoke.errors import (
    AccessDenied,
    CorruptManifest,
    HubUnavailable,
    InvalidRequest,
    NotFound,
    OverLimit,
    SpokeError,
)
from spoke.fetch.scheduler import FetchScheduler
from spoke.prefetch.fill import BackgroundFill
from spoke.prefetch.hints import HintService
from spoke.prefetch.prewarm import CapacityError, PrewarmJobs
from spoke.serve import admindocs
from spoke.serve.routes import cache as cache_routes
from spoke.serve.routes import health, hints, jobs, pins
from spoke.serve.routes.context import AdminContext, LimitReached, NotYours
from spoke.upkeep.pins import PinRegistry

MAX_PINS = 1000
"""Most pins a spoke keeps (each is a row in the index and a set the cache checks)."""

MAX_PIN_BLOCKS = 4_000_000
"""Most block references all pins hold together (each pin keeps its block list in memory,
about 90 bytes a block, and in the index: at most about 360 MiB and 140 MiB), counted per
pin whether or not other pins hold the same blocks; a scoped token holds at most its share."""

MAX_RUNNING_JOBS = 16
"""Most prewarm jobs running at once; more are refused with 429."""

ROUTERS = (jobs.router, pins.router, hints.router, cache_routes.router, health.router)
"""Every resource's routes, in the order the OpenAPI document lists them."""

_HTTP_STATUS: tuple[tuple[type[SpokeError], int], ...] = (
    (NotFound, 404),
    (InvalidRequest, 400),
    (CapacityError, 409),
    (LimitReached, 429),
    (AccessDenied, 403),
    (NotYours, 403),
    (CorruptManifest, 502),
    (HubUnavailable, 503),
)


async def _spoke_error(request: Request, exc: Exception) -> JSONResponse:
    """A domain error as its HTTP status with ``{"detail": ...}`` (and the limit it hit)."""
    status = next((code for kind, code in _HTTP_STATUS if isinstance(exc, kind)), 500)
    content: dict[str, object] = {"detail": str(exc)}
    if isinstance(exc, OverLimit):
        content |= {"limit": exc.limit, "value": exc.value}
    return JSONResponse(status_code=status, content=content)


ERRORS_SHOWN = 20
"""Most validation errors a 422 lists (``errors`` says how many there were)."""


async def _invalid(request: Request, exc: Exception) -> JSONResponse:
    """A body or query that does not validate: FastAPI's 422 ``{"detail": [...]}``, the
    first :data:`ERRORS_SHOWN` errors without the input they quote, and ``errors``, how
    many there were — never an answer that grows with what the caller sent."""
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    shown = [{k: e[k] for k in ("type", "loc", "msg") if k in e} for e in errors[:ERRORS_SHOWN]]
    return JSONResponse(status_code=422, content={"detail": shown, "errors": len(errors)})


def create_app(
    cache: BlockCache,
    scheduler: FetchScheduler,
    catalog: SnapshotCatalog,
    jobs: PrewarmJobs,
    pins: PinRegistry,
    hints: HintService | None = None,
    mount: Path | None = None,
    fill: BackgroundFill | None = None,
    mesh: Callable[[], dict[str, Any]] | None = None,
) -> FastAPI:
    """Build the admin app over the daemon's running components (serve it behind
    :class:`~spoke.serve.adminguard.AdminGuard`: the token check, body cap and audit).

    Args:
        hints: the hint service (None: ``POST /v1/hints`` is refused with 400).
        mount: the spoke's mountpoint (resolved), checked by ``/readyz``.
        fill: background fill, shown in ``/v1/cache``.
        mesh: the regional mesh's state, shown in ``/v1/cache``.
    """
    app = FastAPI(title="Strata spoke admin API", version="1", docs_url=None, redoc_url=None)
    app.state.admin = AdminContext(
        cache=cache,
        scheduler=scheduler,
        catalog=catalog,
        jobs=jobs,
        pins=pins,
        hints=hints,
        mount=mount,
        fill=fill,
        mesh=mesh,
        max_pins=MAX_PINS,
        max_pin_blocks=MAX_PIN_BLOCKS,
        max_running_jobs=MAX_RUNNING_JOBS,
    )
    app.add_exception_handler(SpokeError, _spoke_error)
    app.add_exception_handler(RequestValidationError, _invalid)
    for router in ROUTERS:
        app.include_router(router)

    @app.get("/docs", response_class=HTMLResponse, include_in_schema=False)
    def docs() -> HTMLResponse:
        """The API description as one static page (works offline, no CDN)."""
        return HTMLResponse(admindocs.render(app.openapi()))

    return app


def create_metrics_app(admin: FastAPI) -> FastAPI:
    """``/metrics``, ``/healthz`` and ``/readyz`` of the admin app ``admin`` (the same
    state), and nothing else: the app of ``--metrics``, open to Prometheus and probes on an
    address where the admin API's ``/v1/`` routes and their token never travel. Not behind
    :class:`~spoke.serve.adminguard.AdminGuard`, so no token: its ``/metrics`` shows every
    tenant's usage (names, bytes, hits; no data) to whoever reaches that address."""
    app = FastAPI(title="Strata spoke metrics", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.admin = admin.state.admin
    app.add_exception_handler(SpokeError, _spoke_error)
    app.include_router(health.router)
    return app
