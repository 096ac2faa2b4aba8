"""``/v1/hints``: read-order hints, one stream per reader, installed, listed, removed."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field, ValidationError

from spoke.cache.hintplan import HintPlan, PlanBuilder
from spoke.catalog.selection import MAX_GLOB_CHARS, hint_plan
from spoke.errors import InvalidRequest, NotFound
from spoke.prefetch.hintcaps import HintShare
from spoke.prefetch.hints import MAX_STREAMS
from spoke.serve.admintokens import Caller
from spoke.serve.routes.context import (
    NAME,
    OPERATOR_RESERVE,
    STRICT,
    CallerOf,
    Context,
    NotYours,
    require,
    resolving,
    share_divisor,
    tenant_room,
    v1_router,
)

router = v1_router()

MAX_HINT_PATHS = 1_000_000


class HintRequest(BaseModel):
    """``POST /v1/hints``: files in the order the job will read them (NoPFS-style hints)."""

    model_config = STRICT

    dataset: str = Field(pattern=NAME)
    ref: str = Field(default="latest", pattern=NAME)
    paths: list[Annotated[str, Field(min_length=1, max_length=MAX_GLOB_CHARS)]] = Field(
        min_length=1,
        max_length=MAX_HINT_PATHS,
        # the first bad path is the error, not each one: a million empty paths made a
        # 140 MB answer and 2.3 GiB of daemon (issue 39's seventeenth probe)
        fail_fast=True,
        description="file paths relative to the snapshot root, in planned read order",
    )
    append: bool = Field(default=False, description="extend the stream's hint, not replace it")
    stream: str = Field(
        default="default",
        pattern=NAME,
        description="whose reads these are, e.g. one name per rank of a job; a post "
        "replaces (or extends) only its own stream; a scoped token's names are its own "
        "(installed as TOKEN:NAME)",
    )


def _hint_request(raw: bytes) -> HintRequest:
    """Parses and validates a ``POST /v1/hints`` body (in a worker thread).

    Raises:
        RequestValidationError: FastAPI's 422, as for any other body.
    """
    try:
        return HintRequest.model_validate_json(raw)
    except ValidationError as err:
        errors = err.errors(include_url=False, include_input=False)
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in errors]) from None


_HINT_BODY = {
    "required": True,
    "content": {"application/json": {"schema": HintRequest.model_json_schema()}},
}


@router.post("/v1/hints", status_code=202, openapi_extra={"requestBody": _HINT_BODY})
async def post_hints(request: Request, context: Context, caller: CallerOf) -> dict[str, object]:
    """Install a read-order hint: prefetch ahead of the reads, evict by Belady's rule.

    The body (up to 8 MiB, a million paths) is parsed and turned into a compact plan
    in a worker thread, so the daemon keeps serving meanwhile; a hint past a memory
    cap is a 400 whose body names the cap (``limit``) and its value (``value``). A
    scoped token's streams hold at most a quarter of the node's planned reads and blocks
    (``tenant_positions``, ``tenant_blocks``) and leave the operator's eighth
    (``reserve_positions``, ``reserve_blocks``).
    """
    body = await asyncio.to_thread(_hint_request, await request.body())
    require(caller, body.dataset)
    hints = context.hints
    if hints is None:
        raise InvalidRequest("this spoke was started without hint support")
    key = _key(caller, body.stream)

    def admit() -> None:  # here and again under the post lock: concurrent posts race
        streams = hints.status()
        for installed in streams:  # a stream another team's datasets read is theirs
            if installed.stream == key and not _may_see(caller, installed.source):
                raise NotYours(
                    f"hint stream {body.stream!r} reads datasets admin token {caller.name!r} "
                    "may not act on: name a stream of your own"
                )
        if all(installed.stream != key for installed in streams):  # a new stream
            mine = sum(1 for installed in streams if _may_see(caller, installed.source))
            full = f"{len(streams)} hint streams are installed already"
            tenant_room(caller, len(streams), mine, MAX_STREAMS, "hint streams", full)

    admit()
    catalog = context.catalog
    snapshot = await catalog.resolve_ref(body.dataset, body.ref)
    what = f"{body.dataset}@{body.ref}"
    built: list[int] = []
    # a decoded manifest is tens of MiB a 100,000 files: decoded and planned in one of the
    # spoke's selection slots, two requests resolving per scoped token (the twelfth probe:
    # 48 concurrent posts held 48 manifests, 2.6 GiB)
    with resolving(context, caller):
        async with context.jobs.selection(caller.name or "", snapshot):
            manifest = await catalog.manifest(body.dataset, snapshot.version)

            def build(builder: PlanBuilder) -> HintPlan:
                plan = hint_plan(manifest, body.paths, what, builder)
                built.append(len(plan))
                return plan

            status, prefetching = await hints.post(
                key,
                build,
                append=body.append,
                source=f"{body.dataset}@{snapshot.version}",
                share=_share(caller),
                admit=admit,
            )
    return {
        "dataset": body.dataset,
        "version": snapshot.version,
        "paths": len(body.paths),
        "blocks": built[0],
        **_shown(caller, status.public()),
        "prefetching": prefetching,
    }


@router.get("/v1/hints")
def list_hints(context: Context, caller: CallerOf) -> list[dict[str, object]]:
    """Every installed hint stream: planned reads, cursor, seconds since last used (a
    scoped token: the streams reading only its datasets)."""
    hints = context.hints
    if hints is None:
        return []
    return [_shown(caller, s.public()) for s in hints.status() if _may_see(caller, s.source)]


@router.delete("/v1/hints/{stream}")
def delete_hint(stream: str, context: Context, caller: CallerOf) -> dict[str, object]:
    """Remove a hint stream (a job that ended); eviction forgets its plan."""
    hints = context.hints
    key = _key(caller, stream)
    mine = hints is not None and any(
        s.stream == key and _may_see(caller, s.source) for s in hints.status()
    )
    if hints is None or not mine or not hints.remove(key):
        raise NotFound(f"no hint stream {stream!r}")
    return {"stream": stream, "removed": True}


def _key(caller: Caller, stream: str) -> str:
    """The name stream ``stream`` of ``caller`` is installed under: a scoped token's streams
    are ``TOKEN:STREAM`` (``:`` is in no stream name a body may give), so two teams' streams
    of one name never meet — the thirteenth probe's posts raced an ownership check into
    another team's stream, and a name held by one team told another it existed; the
    operator's are the bare name."""
    return stream if caller.name is None else f"{caller.name}:{stream}"


def _shown(caller: Caller, view: dict[str, object]) -> dict[str, object]:
    """``view`` of a stream as ``caller`` names it (its own prefix left out)."""
    prefix = f"{caller.name}:"
    name = view.get("stream")
    if caller.name is not None and isinstance(name, str) and name.startswith(prefix):
        return {**view, "stream": name.removeprefix(prefix)}
    return view


def _share(caller: Caller) -> HintShare | None:
    """What a scoped ``caller``'s streams may hold of the node's hint totals (the operator:
    no share, every total is its)."""
    if caller.name is None:
        return None
    return HintShare(
        caller.name,
        lambda source: _may_see(caller, source),
        share_divisor(caller.tenants),
        OPERATOR_RESERVE,
    )


def _may_see(caller: Caller, source: str) -> bool:
    """Whether ``caller`` may see a hint stream whose plan reads ``source``
    (``DATASET@VERSION, ...``): every dataset it reads must be the caller's."""
    if caller.operator:
        return True
    datasets = {part.partition("@")[0] for part in source.split(", ") if part}
    return bool(datasets) and all(caller.may(d) for d in datasets)
