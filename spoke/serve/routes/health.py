"""``/healthz``, ``/readyz`` and ``/metrics``.

``/healthz`` and ``/readyz`` are open to probes (no token). ``/metrics`` lists every tenant's
usage, so on the admin port it needs the node's admin token
(:class:`~spoke.serve.adminguard.AdminGuard`); the ``--metrics`` port serves the same three
without a token, for Prometheus and the kubelet (:func:`spoke.serve.admin.create_metrics_app`).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from spoke.disk.mountinfo import is_mounted
from spoke.serve.routes.context import Context, sample

router = APIRouter()


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """Liveness: the daemon's event loop answers."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "not ready"}})
def readyz(context: Context) -> Any:
    """Ready once the mount is up (when this spoke has one) and the hub answered its
    last call or the cache can serve offline."""
    hub_up = sample("strata_spoke_hub_up") == 1.0
    mount = context.mount
    problems = []
    if mount is not None and not is_mounted(mount):
        problems.append(f"mount {mount} is not up")
    bulk = getattr(context.scheduler.fetcher.source, "problem", None)  # hublink/bulk.py
    if context.catalog.hub_refused is not None:
        problems.append(context.catalog.hub_refused)
    elif bulk is not None and len(context.cache) == 0:
        problems.append(f"the hub's bulk channel failed ({bulk}) and the cache is empty")
    elif not hub_up and len(context.cache) == 0:
        problems.append(f"hub {context.scheduler.source_name} unreachable and the cache is empty")
    if not problems:
        return {"status": "ready", "hub_up": hub_up, "mount": str(mount) if mount else None}
    return JSONResponse(
        status_code=503, content={"status": "not ready", "detail": "; ".join(problems)}
    )


@router.get("/metrics", response_class=PlainTextResponse)
def metrics() -> Response:
    """Prometheus exposition of every ``strata_spoke_`` metric. On the admin port: the
    node's admin token only (401 without it, 403 for a scoped token); Prometheus scrapes the
    tokenless ``--metrics`` port."""
    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)
