"""The spoke's admin API (FastAPI, OpenAPI at ``/docs``).

``/healthz``, ``/readyz`` and ``/metrics`` are open (probes and Prometheus); every ``/v1/``
route needs ``Authorization: Bearer <token>`` when the daemon has a token file. Domain
errors map to HTTP statuses here and nowhere else, always with a JSON body
``{"detail": "..."}``: unknown dataset, ref, job or pin → 404; a request that is well formed
but names something invalid (a ``..`` glob, a path that is not in the snapshot) → 400;
a malformed body (FastAPI's own validation) → 422 with its list of problems;
a pin that cannot fit → 409; a dataset the hub token may not read → 403; a manifest that
does not hash to its snapshot id → 502; hub unreachable (or refusing this spoke's token or
certificate) with nothing usable cached → 503.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from spoke.cache.blockcache import BlockCache
from spoke.cache.hintstream import HintPlan, PlanBuilder
from spoke.catalog.catalog import SnapshotCatalog
from spoke.catalog.selection import MAX_GLOB_CHARS, MAX_GLOBS, hint_plan, unique_blocks
from spoke.disk.mountinfo import is_mounted
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
from spoke.upkeep.pins import PinRegistry

STRICT = ConfigDict(extra="forbid", strict=True)  # unknown fields and "yes" for true: 422
NAME = r"^[a-z0-9][a-z0-9._-]{0,63}$"  # dataset, version and tag names (the hub's rule)
Globs = Annotated[
    list[Annotated[str, Field(min_length=1, max_length=MAX_GLOB_CHARS)]],
    Field(
        default_factory=list,
        max_length=MAX_GLOBS,
        description="globs relative to the snapshot root; empty means every file",
    ),
]


class PrewarmRequest(BaseModel):
    """``POST /v1/prewarm``."""

    model_config = STRICT

    dataset: str = Field(pattern=NAME)
    ref: str = Field(default="latest", pattern=NAME, description="a version or a tag")
    paths: Globs
    pin: bool = False


class PinRequest(BaseModel):
    """``POST /v1/pins``: keep these files' blocks out of eviction."""

    model_config = STRICT

    dataset: str = Field(pattern=NAME)
    ref: str = Field(default="latest", pattern=NAME)
    paths: Globs


MAX_HINT_PATHS = 1_000_000


class HintRequest(BaseModel):
    """``POST /v1/hints``: files in the order the job will read them (NoPFS-style hints)."""

    model_config = STRICT

    dataset: str = Field(pattern=NAME)
    ref: str = Field(default="latest", pattern=NAME)
    paths: list[Annotated[str, Field(min_length=1, max_length=MAX_GLOB_CHARS)]] = Field(
        min_length=1,
        max_length=MAX_HINT_PATHS,
        description="file paths relative to the snapshot root, in planned read order",
    )
    append: bool = Field(default=False, description="extend the stream's hint, not replace it")
    stream: str = Field(
        default="default",
        pattern=NAME,
        description="whose reads these are, e.g. one name per rank of a job; a post "
        "replaces (or extends) only its own stream",
    )


def _hint_request(raw: bytes) -> HintRequest:
    """Parses and validates a ``POST /v1/hints`` body (in a worker thread).

    Raises:
        RequestValidationError: FastAPI's 422, as for any other body.
    """
    try:
        return HintRequest.model_validate_json(raw)
    except ValidationError as err:
        errors = err.errors(include_url=False)
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in errors]) from None


class EvictRequest(BaseModel):
    """``POST /v1/evict``: a dataset, one version (or tag) of it, or everything."""

    model_config = STRICT

    dataset: str | None = Field(default=None, pattern=NAME)
    ref: str | None = Field(default=None, pattern=NAME)
    all: bool = False


BEARER = HTTPBearer(auto_error=False)

MAX_PINS = 1000
"""Most pins a spoke keeps (each is a row in the index and a set the cache checks)."""

MAX_RUNNING_JOBS = 16
"""Most prewarm jobs running at once; more are refused with 429."""


class LimitReached(SpokeError):
    """Too many pins or running jobs; the message says which limit and what to do."""


class ErrorBody(BaseModel):
    """Every error this API raises itself: one line saying what is wrong."""

    detail: str


_HTTP_STATUS: tuple[tuple[type[SpokeError], int], ...] = (
    (NotFound, 404),
    (InvalidRequest, 400),
    (CapacityError, 409),
    (LimitReached, 429),
    (AccessDenied, 403),
    (CorruptManifest, 502),
    (HubUnavailable, 503),
)


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
    pinned_bytes: int
    datasets: dict[str, int] = Field(
        description="cached bytes per dataset (a block shared by two datasets counts in both)"
    )
    fetch: dict[str, Any] = Field(
        default_factory=dict,
        description="the fetch scheduler: window, rate, RTT, bytes on the wire, queues by "
        "class; prefetch: per source (hint, readahead, crossfile, fill) its window and bytes "
        "outstanding, issued, used and wasted",
    )
    fill: dict[str, Any] = Field(
        default_factory=dict,
        description="background fill: mode, rate limit, and per snapshot state and progress",
    )
    mesh: dict[str, Any] = Field(
        default_factory=dict,
        description="regional mesh: this node, live nodes, owned share, peers' state, "
        "bytes, blocks and stream seconds by source (hub, peer, local), peer errors",
    )


def _sample(name: str) -> float:
    value = REGISTRY.get_sample_value(name)
    return 0.0 if value is None else value


def create_app(
    cache: BlockCache,
    fetcher: FetchScheduler,
    catalog: SnapshotCatalog,
    jobs: PrewarmJobs,
    pins: PinRegistry,
    token: str | None = None,
    hints: HintService | None = None,
    mount: Path | None = None,
    fill: BackgroundFill | None = None,
    mesh: Callable[[], dict[str, Any]] | None = None,
) -> FastAPI:
    """Build the admin app over the daemon's running components.

    Args:
        token: the bearer token every ``/v1/`` route requires; None disables the check
            (the API then relies on listening on 127.0.0.1 only).
        mount: the spoke's mountpoint (resolved), checked by ``/readyz``.
        fill: background fill, shown in ``/v1/cache``.
        mesh: the regional mesh's state, shown in ``/v1/cache``.
    """
    app = FastAPI(title="Strata spoke admin API", version="1", docs_url=None, redoc_url=None)

    @app.get("/docs", response_class=HTMLResponse, include_in_schema=False)
    def docs() -> HTMLResponse:
        """The API description as one static page (works offline, no CDN)."""
        return HTMLResponse(admindocs.render(app.openapi()))

    def authorize(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)],
    ) -> None:
        if token is None:
            return
        if credentials is None or not secrets.compare_digest(
            credentials.credentials.encode(), token.encode()
        ):
            raise HTTPException(
                401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"}
            )

    @app.exception_handler(SpokeError)
    async def spoke_error(request: Request, exc: SpokeError) -> JSONResponse:
        status = next((code for kind, code in _HTTP_STATUS if isinstance(exc, kind)), 500)
        content: dict[str, object] = {"detail": str(exc)}
        if isinstance(exc, OverLimit):
            content |= {"limit": exc.limit, "value": exc.value}
        return JSONResponse(status_code=status, content=content)

    auth = [Depends(authorize)]
    errors: dict[int | str, dict[str, Any]] = {
        400: {"model": ErrorBody, "description": "invalid paths or arguments"},
        401: {"model": ErrorBody, "description": "missing or wrong token"},
        403: {"model": ErrorBody, "description": "the hub's token may not read the dataset"},
        404: {"model": ErrorBody, "description": "unknown dataset, ref, job or pin"},
        409: {"model": ErrorBody, "description": "does not fit beside existing pins"},
        413: {"model": ErrorBody, "description": "request body too large"},
        429: {"model": ErrorBody, "description": "too many pins or running jobs"},
        502: {"model": ErrorBody, "description": "the hub sent a manifest that fails its id"},
        503: {"model": ErrorBody, "description": "hub unreachable and nothing usable cached"},
    }

    @app.post("/v1/prewarm", status_code=202, dependencies=auth, responses=errors)
    async def prewarm(body: PrewarmRequest) -> dict[str, object]:
        """Start fetching a snapshot's files into the cache; returns the job."""
        running = sum(1 for j in jobs.all() if j.state == "running")
        if running >= MAX_RUNNING_JOBS:
            raise LimitReached(
                f"{running} prewarm jobs are running (at most {MAX_RUNNING_JOBS}); "
                "wait for one or cancel it (DELETE /v1/jobs/ID)"
            )
        if body.pin and len(pins.all()) >= MAX_PINS:
            raise LimitReached(f"{MAX_PINS} pins exist; remove some (DELETE /v1/pins/ID)")
        job = await jobs.start(body.dataset, body.ref, body.paths, body.pin)
        return job.public()

    @app.get("/v1/jobs", dependencies=auth, responses=errors)
    def list_jobs() -> list[dict[str, object]]:
        """Every remembered prewarm job, newest first."""
        return [j.public() for j in jobs.all()]

    @app.get("/v1/jobs/{job_id}", dependencies=auth, responses=errors)
    def get_job(job_id: str) -> dict[str, object]:
        """A job's state, bytes done/total, rate (bytes/s) and ETA (s)."""
        job = jobs.get(job_id)
        if job is None:
            raise NotFound(f"no prewarm job {job_id!r}")
        return job.public()

    @app.delete("/v1/jobs/{job_id}", dependencies=auth, responses=errors)
    async def cancel_job(job_id: str) -> dict[str, object]:
        """Cancel a running job (blocks already fetched stay cached)."""
        job = await jobs.cancel(job_id)
        if job is None:
            raise NotFound(f"no prewarm job {job_id!r}")
        return job.public()

    @app.post("/v1/pins", status_code=201, dependencies=auth, responses=errors)
    async def add_pin(body: PinRequest) -> dict[str, object]:
        """Pin files of a snapshot (their blocks stay cached once fetched)."""
        if len(pins.all()) >= MAX_PINS:
            raise LimitReached(f"{MAX_PINS} pins exist; remove some (DELETE /v1/pins/ID)")
        snapshot, globs, _, blocks = await jobs.resolve(body.dataset, body.ref, body.paths)
        jobs.check_pin_room(f"{body.dataset}@{body.ref}", blocks)
        return pins.add(body.dataset, body.ref, snapshot.version, globs, blocks).public()

    hint_body = {
        "required": True,
        "content": {"application/json": {"schema": HintRequest.model_json_schema()}},
    }

    @app.post(
        "/v1/hints",
        status_code=202,
        dependencies=auth,
        responses=errors,
        openapi_extra={"requestBody": hint_body},
    )
    async def post_hints(request: Request) -> dict[str, object]:
        """Install a read-order hint: prefetch ahead of the reads, evict by Belady's rule.

        The body (up to 8 MiB, a million paths) is parsed and turned into a compact plan
        in a worker thread, so the daemon keeps serving meanwhile; a hint past a memory
        cap is a 400 whose body names the cap (``limit``) and its value (``value``).
        """
        body = await asyncio.to_thread(_hint_request, await request.body())
        if hints is None:
            raise InvalidRequest("this spoke was started without hint support")
        snapshot = await catalog.resolve_ref(body.dataset, body.ref)
        manifest = await catalog.manifest(body.dataset, snapshot.version)
        what = f"{body.dataset}@{body.ref}"
        built: list[int] = []

        def build(builder: PlanBuilder) -> HintPlan:
            plan = hint_plan(manifest, body.paths, what, builder)
            built.append(len(plan))
            return plan

        status, prefetching = await hints.post(
            body.stream,
            build,
            append=body.append,
            source=f"{body.dataset}@{snapshot.version}",
        )
        return {
            "dataset": body.dataset,
            "version": snapshot.version,
            "paths": len(body.paths),
            "blocks": built[0],
            **status.public(),
            "prefetching": prefetching,
        }

    @app.get("/v1/hints", dependencies=auth, responses=errors)
    def list_hints() -> list[dict[str, object]]:
        """Every installed hint stream: planned reads, cursor, seconds since last used."""
        return [s.public() for s in hints.status()] if hints is not None else []

    @app.delete("/v1/hints/{stream}", dependencies=auth, responses=errors)
    def delete_hint(stream: str) -> dict[str, object]:
        """Remove a hint stream (a job that ended); eviction forgets its plan."""
        if hints is None or not hints.remove(stream):
            raise NotFound(f"no hint stream {stream!r}")
        return {"stream": stream, "removed": True}

    @app.get("/v1/pins", dependencies=auth, responses=errors)
    def list_pins() -> list[dict[str, object]]:
        """Every pin, oldest first."""
        return [p.public() for p in pins.all()]

    @app.delete("/v1/pins/{pin_id}", dependencies=auth, responses=errors)
    def delete_pin(pin_id: str) -> dict[str, object]:
        """Remove a pin; its blocks become evictable unless another pin holds them."""
        pin = pins.remove(pin_id)
        if pin is None:
            raise NotFound(f"no pin {pin_id!r}")
        return pin.public()

    @app.post("/v1/evict", dependencies=auth, responses=errors)
    async def evict(body: EvictRequest) -> dict[str, object]:
        """Drop cached blocks of a dataset, of one version of it, or of everything.

        Pinned blocks stay; they are counted in the answer.
        """
        if body.all == (body.dataset is not None):
            raise InvalidRequest("give either a dataset (and optionally a ref) or all=true")
        if body.ref is not None and body.dataset is None:
            raise InvalidRequest("ref needs a dataset")
        if body.all:
            targets = list(cache.resident())
        else:
            assert body.dataset is not None
            if body.ref is not None:
                versions = [(await catalog.resolve_ref(body.dataset, body.ref)).version]
            else:
                versions = [v.version for v in (await catalog.list_versions(body.dataset)).versions]
            seen: dict[str, int] = {}
            for version in versions:
                seen.update(unique_blocks(await catalog.manifest(body.dataset, version)))
            targets = [d for d in seen if cache.contains(d)]
        dropped = kept = 0
        for digest in targets:
            if cache.is_pinned(digest):
                kept += 1
            elif cache.drop(digest):
                dropped += 1
        return {
            "evicted_blocks": dropped,
            "pinned_blocks_kept": kept,
            "used_bytes": cache.used_bytes,
        }

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        """Liveness: the daemon's event loop answers."""
        return {"status": "ok"}

    @app.get("/readyz", responses={503: {"description": "not ready"}})
    def readyz() -> Any:
        """Ready once the mount is up (when this spoke has one) and the hub answered its
        last call or the cache can serve offline."""
        hub_up = _sample("strata_spoke_hub_up") == 1.0
        problems = []
        if mount is not None and not is_mounted(mount):
            problems.append(f"mount {mount} is not up")
        if catalog.hub_refused is not None:
            problems.append(catalog.hub_refused)
        elif not hub_up and len(cache) == 0:
            problems.append(f"hub {fetcher.source_name} unreachable and the cache is empty")
        if not problems:
            return {"status": "ready", "hub_up": hub_up, "mount": str(mount) if mount else None}
        return JSONResponse(
            status_code=503, content={"status": "not ready", "detail": "; ".join(problems)}
        )

    @app.get("/v1/cache", response_model=CacheStats, dependencies=auth, responses=errors)
    def cache_stats() -> CacheStats:
        """Cache size, use, hit ratio and hub traffic."""
        hits = int(_sample("strata_spoke_cache_hits_total"))
        misses = int(_sample("strata_spoke_cache_misses_total"))
        return CacheStats(
            capacity_bytes=cache.capacity_bytes,
            used_bytes=cache.used_bytes,
            blocks=len(cache),
            inflight_fetches=fetcher.inflight,
            hits=hits,
            misses=misses,
            hit_ratio=hits / (hits + misses) if hits + misses else 0.0,
            hub_fetch_bytes=int(_sample("strata_spoke_hub_fetch_bytes_total")),
            hub=fetcher.source_name,
            hub_up=_sample("strata_spoke_hub_up") == 1.0,
            pinned_bytes=cache.pinned_bytes,
            datasets=dataset_usage(),
            fetch=fetcher.snapshot(),
            fill=fill.status() if fill is not None else {},
            mesh=mesh() if mesh is not None else {},
        )

    def dataset_usage() -> dict[str, int]:
        usage: dict[str, dict[str, int]] = {}
        for sid in catalog.stored_snapshots():
            dataset = catalog.snapshot_dataset(sid)
            if dataset is None:
                continue
            held = usage.setdefault(dataset, {})
            for digest, size in unique_blocks(catalog.stored_manifest(sid)).items():
                if cache.contains(digest):
                    held[digest] = size
        return {name: sum(blocks.values()) for name, blocks in sorted(usage.items())}

    @app.get("/metrics", response_class=PlainTextResponse)
    def metrics() -> Response:
        """Prometheus exposition of every ``strata_spoke_`` metric."""
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    return app
