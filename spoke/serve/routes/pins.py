"""``/v1/pins``: files of a snapshot held out of eviction."""

from __future__ import annotations

from pydantic import BaseModel, Field

from spoke.errors import NotFound
from spoke.serve.routes.context import (
    NAME,
    STRICT,
    CallerOf,
    Context,
    Globs,
    pin_room,
    require,
    resolving,
    v1_router,
)

router = v1_router()


class PinRequest(BaseModel):
    """``POST /v1/pins``: keep these files' blocks out of eviction."""

    model_config = STRICT

    dataset: str = Field(pattern=NAME)
    ref: str = Field(default="latest", pattern=NAME)
    paths: Globs


@router.post("/v1/pins", status_code=201)
async def add_pin(body: PinRequest, context: Context, caller: CallerOf) -> dict[str, object]:
    """Pin files of a snapshot (their blocks stay cached once fetched)."""
    require(caller, body.dataset)
    pin_room(context, caller)
    jobs = context.jobs
    with resolving(context, caller):
        snapshot, globs, _, blocks = await jobs.resolve(
            body.dataset, body.ref, body.paths, caller.name or ""
        )
    # again, with the blocks, and no await before the add: concurrent pins race
    pin_room(context, caller, len(blocks))
    jobs.check_pin_room(f"{body.dataset}@{body.ref}", blocks, body.dataset)
    return context.pins.add(body.dataset, body.ref, snapshot.version, globs, blocks).public()


@router.get("/v1/pins")
def list_pins(context: Context, caller: CallerOf) -> list[dict[str, object]]:
    """Every pin, oldest first (a scoped token: of its datasets)."""
    return [p.public() for p in context.pins.all() if caller.may(p.dataset)]


@router.delete("/v1/pins/{pin_id}")
def delete_pin(pin_id: str, context: Context, caller: CallerOf) -> dict[str, object]:
    """Remove a pin; its blocks become evictable unless another pin holds them."""
    mine = context.pins.get(pin_id)
    if mine is None or not caller.may(mine.dataset):
        raise NotFound(f"no pin {pin_id!r}")
    pin = context.pins.remove(pin_id)
    if pin is None:
        raise NotFound(f"no pin {pin_id!r}")
    return pin.public()
