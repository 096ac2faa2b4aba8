"""``/v1/cache`` and ``/v1/evict``: what the cache holds, and dropping parts of it."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from spoke.catalog.selection import unique_blocks
from spoke.errors import InvalidRequest
from spoke.serve.routes.context import (
    NAME,
    STRICT,
    AdminContext,
    CallerOf,
    Context,
    require_operator,
    sample,
    v1_router,
)

router = v1_router()


class EvictRequest(BaseModel):
    """``POST /v1/evict``: a dataset, one version (or tag) of it, or everything."""

    model_config = STRICT

    dataset: str | None = Field(default=None, pattern=NAME)
    ref: str | None = Field(default=None, pattern=NAME)
    all: bool = False


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
    tenants: dict[str, Any] = Field(
        default_factory=dict,
        description="with --tenants, per tenant: its cache and link shares (fractions), the "
        "bytes its cache share keeps and its resident bytes",
    )


@router.post("/v1/evict")
async def evict(body: EvictRequest, context: Context, caller: CallerOf) -> dict[str, object]:
    """Drop cached blocks of a dataset, of one version of it, or of everything (the
    node-wide token only: what is cached is shared by every tenant).

    Pinned blocks stay; they are counted in the answer.
    """
    require_operator(caller, "eviction")
    if body.all == (body.dataset is not None):
        raise InvalidRequest("give either a dataset (and optionally a ref) or all=true")
    if body.ref is not None and body.dataset is None:
        raise InvalidRequest("ref needs a dataset")
    cache, catalog = context.cache, context.catalog
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


@router.get("/v1/cache", response_model=CacheStats)
def cache_stats(context: Context, caller: CallerOf) -> CacheStats:
    """Cache size, use, hit ratio and hub traffic (the node-wide token only: it names
    every tenant's datasets)."""
    require_operator(caller, "the node's cache status")
    cache, scheduler = context.cache, context.scheduler
    hits = int(sample("strata_spoke_cache_hits_total"))
    misses = int(sample("strata_spoke_cache_misses_total"))
    return CacheStats(
        capacity_bytes=cache.capacity_bytes,
        used_bytes=cache.used_bytes,
        blocks=len(cache),
        inflight_fetches=scheduler.inflight,
        hits=hits,
        misses=misses,
        hit_ratio=hits / (hits + misses) if hits + misses else 0.0,
        hub_fetch_bytes=int(sample("strata_spoke_hub_fetch_bytes_total")),
        hub=scheduler.source_name,
        hub_up=sample("strata_spoke_hub_up") == 1.0,
        pinned_bytes=cache.pinned_bytes,
        datasets=_dataset_usage(context),
        fetch=scheduler.snapshot(),
        fill=context.fill.status() if context.fill is not None else {},
        mesh=context.mesh() if context.mesh is not None else {},
        tenants=cache.tenants.snapshot() if cache.tenants is not None else {},
    )


def _dataset_usage(context: AdminContext) -> dict[str, int]:
    """Cached bytes per dataset of the stored manifests (a shared block counts in each)."""
    cache, catalog = context.cache, context.catalog
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
