"""What every admin route shares: the running components (:class:`AdminContext`, in
``app.state``, handed to routes by the :data:`Context` dependency), the error answers the
OpenAPI document lists, and the declaration of the bearer token.

The token is *checked* in one place, :class:`spoke.serve.adminguard.AdminGuard`, before any
byte of a body is read (FastAPI parses a body before it runs dependencies). The ``/v1/``
routers here only declare the scheme (:data:`BEARER_DECLARED`), so that the OpenAPI document
says which routes need ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.security import HTTPBearer
from prometheus_client import REGISTRY
from pydantic import BaseModel, ConfigDict, Field

from spoke.cache.blockcache import BlockCache
from spoke.catalog.catalog import SnapshotCatalog
from spoke.catalog.selection import MAX_GLOB_CHARS, MAX_GLOBS
from spoke.errors import SpokeError
from spoke.fetch.scheduler import FetchScheduler
from spoke.prefetch.fill import BackgroundFill
from spoke.prefetch.hints import HintService
from spoke.prefetch.prewarm import PrewarmJobs
from spoke.serve.adminguard import CALLER_STATE
from spoke.serve.admintokens import OPERATOR, Caller
from spoke.upkeep.pins import PinRegistry

STRICT = ConfigDict(extra="forbid", strict=True)  # unknown fields and "yes" for true: 422
NAME = r"^[a-z0-9][a-z0-9._-]{0,63}$"  # dataset, version and tag names (the hub's rule)
Globs = Annotated[
    list[Annotated[str, Field(min_length=1, max_length=MAX_GLOB_CHARS)]],
    Field(
        default_factory=list,
        max_length=MAX_GLOBS,
        fail_fast=True,  # the first bad glob is the error, not one a glob
        description="globs relative to the snapshot root; empty means every file",
    ),
]


@dataclass(frozen=True)
class AdminContext:
    """The daemon's running components the admin routes act on.

    Attributes:
        mount: the spoke's mountpoint (resolved), checked by ``/readyz``.
        fill: background fill, shown in ``/v1/cache``.
        mesh: the regional mesh's state, shown in ``/v1/cache``.
        max_pins: most pins a spoke keeps; more are refused with 429.
        max_running_jobs: most prewarm jobs running at once; more are refused with 429.
        max_pin_blocks: most block references all pins hold together (a pin of N blocks
            holds N, however many other pins hold the same blocks); more are refused with
            429.
    """

    cache: BlockCache
    scheduler: FetchScheduler
    catalog: SnapshotCatalog
    jobs: PrewarmJobs
    pins: PinRegistry
    hints: HintService | None
    mount: Path | None
    fill: BackgroundFill | None
    mesh: Callable[[], dict[str, Any]] | None
    max_pins: int
    max_running_jobs: int
    max_pin_blocks: int = 4_000_000
    resolving: dict[str, int] = field(default_factory=dict)  # scoped token → requests


RESOLVING_PER_TOKEN = 2
"""Pin and prewarm requests one scoped token may have resolving at once (their globs are
matched against a manifest in a worker thread, :data:`spoke.prefetch.prewarm.SELECTIONS` at
a time for the whole spoke); more are refused with 429 at once, so one token's many
concurrent requests cannot queue ahead of another team's (a probe's 200 concurrent posts)."""


@contextlib.contextmanager
def resolving(context: AdminContext, caller: Caller) -> Iterator[None]:
    """Count one of ``caller``'s requests as resolving while the block runs; the node-wide
    token's are not limited.

    Raises:
        LimitReached: a scoped token has :data:`RESOLVING_PER_TOKEN` requests resolving.
    """
    if caller.name is None:
        yield
        return
    held = context.resolving.get(caller.name, 0)
    if held >= RESOLVING_PER_TOKEN:
        raise LimitReached(
            f"admin token {caller.name!r} has {held} pin or prewarm requests being resolved "
            f"(at most {RESOLVING_PER_TOKEN} at once); retry when one has answered"
        )
    context.resolving[caller.name] = held + 1
    try:
        yield
    finally:
        left = context.resolving[caller.name] - 1
        if left:
            context.resolving[caller.name] = left
        else:
            del context.resolving[caller.name]


async def admin_context(request: Request) -> AdminContext:
    """The dependency behind :data:`Context` (a coroutine: no worker thread per request)."""
    context: AdminContext = request.app.state.admin
    return context


Context = Annotated[AdminContext, Depends(admin_context)]


async def admin_caller(request: Request) -> Caller:
    """The dependency behind :data:`CallerOf`: who :class:`~spoke.serve.adminguard.AdminGuard`
    let in (the operator when the app runs unguarded, as in-process tests do)."""
    caller = getattr(request.state, CALLER_STATE, OPERATOR)
    assert isinstance(caller, Caller)
    return caller


CallerOf = Annotated[Caller, Depends(admin_caller)]


class NotYours(SpokeError):
    """A scoped admin token asked for a dataset outside its scope, or for what only the
    node-wide token may do (403)."""


def require(caller: Caller, dataset: str) -> None:
    """Let ``caller`` act on ``dataset``.

    Raises:
        NotYours: outside a scoped token's datasets.
    """
    if not caller.may(dataset):
        raise NotYours(f"admin token {caller.name!r} may not act on dataset {dataset!r}")


def require_operator(caller: Caller, what: str) -> None:
    """Let only the node-wide token's holder do ``what``.

    Raises:
        NotYours: a scoped token.
    """
    if not caller.operator:
        raise NotYours(f"{what} needs the node's admin token; {caller.name!r} is scoped")


BEARER_DECLARED = HTTPBearer(auto_error=False)
"""Declares the bearer scheme of ``/v1/`` routes in the OpenAPI document; it refuses
nothing (the token is checked by :class:`~spoke.serve.adminguard.AdminGuard`)."""


class LimitReached(SpokeError):
    """Too many pins or running jobs; the message says which limit and what to do."""


class ErrorBody(BaseModel):
    """Every error this API raises itself: one line saying what is wrong."""

    detail: str


ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "invalid paths or arguments"},
    401: {"model": ErrorBody, "description": "missing or wrong token"},
    403: {
        "model": ErrorBody,
        "description": "the hub's token may not read the dataset, or a scoped admin token "
        "may not act on it",
    },
    404: {"model": ErrorBody, "description": "unknown dataset, ref, job or pin"},
    409: {"model": ErrorBody, "description": "does not fit beside existing pins"},
    413: {"model": ErrorBody, "description": "request body too large"},
    429: {"model": ErrorBody, "description": "too many pins or running jobs"},
    502: {"model": ErrorBody, "description": "the hub sent a manifest that fails its id"},
    503: {"model": ErrorBody, "description": "hub unreachable and nothing usable cached"},
}
"""The error answers every ``/v1/`` route lists in the OpenAPI document."""


def v1_router() -> APIRouter:
    """A router for ``/v1/`` routes: the bearer scheme declared, :data:`ERRORS` listed."""
    return APIRouter(dependencies=[Depends(BEARER_DECLARED)], responses=ERRORS)


def sample(name: str) -> float:
    """A metric's current value in the process registry (0 when it has none yet)."""
    value = REGISTRY.get_sample_value(name)
    return 0.0 if value is None else value


SCOPED_SHARE = 4
"""A scoped admin token may hold at most 1/``SCOPED_SHARE`` of the spoke's pins, running
prewarm jobs, hint streams and the hint streams' planned reads and blocks on its datasets
(issue 39's fifth probe: one team's token made 999 pins and every other team's pin and
pinned prewarm was refused 429; the seventh: its 4 streams of 4 million planned reads filled
the node's 16 million and every other team's hint was refused 400), and less when there are
more than three scoped tokens (:func:`share_divisor`)."""

OPERATOR_RESERVE = 8
"""The last 1/``OPERATOR_RESERVE`` of the pins, running jobs, hint streams and their planned
reads and blocks (at least one) are kept for the node-wide token: scoped tokens together
cannot lock the operator out."""


def share_divisor(tenants: int) -> int:
    """A scoped token's share is 1/``share_divisor(tenants)`` of each limit when ``tenants``
    scoped tokens are configured: 1/:data:`SCOPED_SHARE` while all of them fit beside the
    operator's reserve, else the scoped part (7/8) split evenly — so every token's share
    fits beside all the others' (issue 39's eighth probe: four colluding tokens at 1/4 each
    took 7/8 of the pins and hint plans, and a fifth team was refused every one)."""
    return max(SCOPED_SHARE, -(-OPERATOR_RESERVE * max(1, tenants) // (OPERATOR_RESERVE - 1)))


def tenant_room(caller: Caller, total: int, mine: int, limit: int, what: str, full: str) -> None:
    """Refuse ``caller`` one more of ``what`` when ``total`` exist of at most ``limit``
    (``full`` says so), or, for a scoped token, when it holds its share (``mine`` on its
    datasets) or the rest is the operator's reserve: pins, running prewarm jobs and hint
    streams alike.

    Raises:
        LimitReached: a limit is reached.
    """
    if total >= limit:
        raise LimitReached(full)
    if caller.operator:
        return
    share = max(1, limit // share_divisor(caller.tenants))
    reserve = max(1, limit // OPERATOR_RESERVE)
    if mine >= share:
        raise LimitReached(
            f"admin token {caller.name!r} holds {mine} {what} on its datasets, the most a "
            f"scoped token may ({share} of {limit}); remove some"
        )
    if total >= limit - reserve:
        raise LimitReached(
            f"{total} {what} exist here; the last {reserve} of {limit} are kept for the "
            "node's admin token"
        )


def pin_room(context: AdminContext, caller: Caller = OPERATOR, blocks: int = 0) -> None:
    """Refuse a new pin of ``blocks`` blocks when :attr:`AdminContext.max_pins` exist or
    the pins' block references would pass :attr:`AdminContext.max_pin_blocks`, or, for a
    scoped token, when either would pass its share (:func:`share_divisor`) or reach into
    the operator's reserve (:data:`OPERATOR_RESERVE`). Each pin keeps its block list in
    memory and in the index, whether or not other pins hold the same blocks (the thirteenth
    probe: one token's 250 whole-dataset pins of 100,000 files took the spoke to 2.8 GiB,
    and to 3.4 GiB again at restart; 100 of 400,000 files, 5.5 GiB).

    Raises:
        LimitReached: a limit is reached.
    """
    pins = context.pins.all()
    mine = [pin for pin in pins if caller.may(pin.dataset)]
    full = f"{len(pins)} pins exist; remove some (DELETE /v1/pins/ID)"
    tenant_room(caller, len(pins), len(mine), context.max_pins, "pins", full)
    if blocks:
        held = sum(pin.blocks for pin in pins)
        limit = context.max_pin_blocks
        what = "pinned block references"
        if held + blocks > limit:
            raise LimitReached(
                f"pinning {blocks:,} more blocks would hold {held + blocks:,} {what}, of at "
                f"most {limit:,}; remove some pins (DELETE /v1/pins/ID)"
            )
        if not caller.operator:
            share = limit // share_divisor(caller.tenants)
            reserve = limit // OPERATOR_RESERVE
            own = sum(pin.blocks for pin in mine)
            if own + blocks > share:
                raise LimitReached(
                    f"admin token {caller.name!r} holds {own:,} {what} on its datasets and "
                    f"may hold at most {share:,} ({blocks:,} more asked); remove some pins"
                )
            if held + blocks > limit - reserve:
                raise LimitReached(
                    f"{held:,} {what} exist here; the last {reserve:,} of {limit:,} are kept "
                    "for the node's admin token"
                )


def job_room(context: AdminContext, caller: Caller = OPERATOR) -> None:
    """Refuse a new prewarm job when :attr:`AdminContext.max_running_jobs` run, or, for a
    scoped token, when its datasets' jobs are its share or only the reserve is left.

    Raises:
        LimitReached: a limit is reached.
    """
    running = [job for job in context.jobs.all() if job.state == "running"]
    mine = sum(1 for job in running if caller.may(job.dataset))
    limit = context.max_running_jobs
    full = (
        f"{len(running)} prewarm jobs are running (at most {limit}); "
        "wait for one or cancel it (DELETE /v1/jobs/ID)"
    )
    tenant_room(caller, len(running), mine, limit, "running prewarm jobs", full)
