"""``/v1/prewarm`` and ``/v1/jobs``: prewarm jobs, started, listed, cancelled."""

from __future__ import annotations

from pydantic import BaseModel, Field

from spoke.errors import NotFound
from spoke.serve.routes.context import (
    NAME,
    STRICT,
    CallerOf,
    Context,
    Globs,
    job_room,
    pin_room,
    require,
    resolving,
    v1_router,
)

router = v1_router()


class PrewarmRequest(BaseModel):
    """``POST /v1/prewarm``."""

    model_config = STRICT

    dataset: str = Field(pattern=NAME)
    ref: str = Field(default="latest", pattern=NAME, description="a version or a tag")
    paths: Globs
    pin: bool = False


@router.post("/v1/prewarm", status_code=202)
async def prewarm(body: PrewarmRequest, context: Context, caller: CallerOf) -> dict[str, object]:
    """Start fetching a snapshot's files into the cache; returns the job."""
    require(caller, body.dataset)

    def admit(blocks: int = 0) -> None:  # here, and with the blocks just before the job is
        job_room(context, caller)  # added: concurrent posts race
        if body.pin:
            pin_room(context, caller, blocks)

    admit()
    with resolving(context, caller):
        job = await context.jobs.start(
            body.dataset, body.ref, body.paths, body.pin, admit, caller.name or ""
        )
    return job.public()


@router.get("/v1/jobs")
def list_jobs(context: Context, caller: CallerOf) -> list[dict[str, object]]:
    """Every remembered prewarm job, newest first (a scoped token: of its datasets)."""
    return [j.public() for j in context.jobs.all() if caller.may(j.dataset)]


@router.get("/v1/jobs/{job_id}")
def get_job(job_id: str, context: Context, caller: CallerOf) -> dict[str, object]:
    """A job's state, bytes done/total, rate (bytes/s) and ETA (s)."""
    job = context.jobs.get(job_id)
    if job is None or not caller.may(job.dataset):
        raise NotFound(f"no prewarm job {job_id!r}")
    return job.public()


@router.delete("/v1/jobs/{job_id}")
async def cancel_job(job_id: str, context: Context, caller: CallerOf) -> dict[str, object]:
    """Cancel a running job (blocks already fetched stay cached)."""
    mine = context.jobs.get(job_id)
    if mine is None or not caller.may(mine.dataset):
        raise NotFound(f"no prewarm job {job_id!r}")
    job = await context.jobs.cancel(job_id)
    if job is None:
        raise NotFound(f"no prewarm job {job_id!r}")
    return job.public()
