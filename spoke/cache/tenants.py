"""Tenants' shares of the cache: one team's prewarm, pins, fill or reads cannot evict
another team's blocks below that team's share.

The file (``strata-spoke run --tenants FILE``, YAML, re-read when it changes) names each
tenant, the datasets that are its own (globs, as the scoped admin tokens') and its shares:

```yaml
team-a:
  datasets: [team-a, "team-a-*"]
  cache_share: 0.4   # of --cache-size, kept for team-a's blocks against other tenants
  link_share: 0.5    # of the fetch window for team-a's prefetch while others miss
```

**Whose block.** A block belongs to the tenant whose datasets hold it, found when it is
admitted (and for every resident block when the daemon starts) from the datasets of the
live snapshots stored here that hold it (:mod:`spoke.catalog.blockscope`); a block held by
datasets of several tenants is the first's by name, one no tenant holds is nobody's. So a
tenant's bytes are its resident blocks' bytes, whoever's request brought them in.

**The rule.** An eviction made for tenant T — room for T's admission, whatever its class
— and the background evictor (for nobody) pass over a block of another tenant U while
evicting it would leave U below its share (``cache_share`` × the cache size): U's blocks
above its share are evictable like any others, and unowned blocks always. Shares sum to
at most 1; when they come near it the evictor may stop above its low watermark (what is
left over the watermark is other tenants' protected share), and an admission that finds
only protected blocks in its way is refused and streams through (``CacheFull``), as one
that finds only pinned blocks is.

Per tenant, for chargeback: ``strata_spoke_tenant_resident_bytes{tenant}``,
``strata_spoke_tenant_admitted_bytes_total{tenant}`` and
``strata_spoke_tenant_reads_total{tenant,outcome}``. ``link_share`` is the fetch
scheduler's (:mod:`spoke.fetch.scheduler`).

Memory: one dictionary entry per resident block (digest, tenant, size: about 150 bytes),
only while a tenants file is set.

Everything runs on the daemon's event loop (no locks).
"""

from __future__ import annotations

import fnmatch
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from spoke import metrics
from strata_local.reloading import ReloadingFile, load_yaml

DatasetsOf = Callable[[Sequence[str]], Mapping[str, Iterable[str]]]
"""Digests -> the datasets holding each (digests no live snapshot holds are left out)."""


class TenantsError(ValueError):
    """A tenants file that cannot be read or does not parse (the message says where)."""


@dataclass(frozen=True)
class Tenant:
    """One tenant: its datasets (globs) and its shares (fractions, 0 to 1)."""

    name: str
    datasets: tuple[str, ...]
    cache_share: float = 0.0
    link_share: float = 0.0

    def holds(self, dataset: str) -> bool:
        """Whether ``dataset`` is this tenant's."""
        return any(fnmatch.fnmatchcase(dataset, g) for g in self.datasets)


def parse(text: str, where: str = "the tenants file") -> dict[str, Tenant]:
    """Name -> :class:`Tenant`, in name order.

    Raises:
        TenantsError: not a mapping of names to ``{datasets, cache_share, link_share}``, a
            share outside [0, 1], or shares summing above 1.
    """
    loaded = load_yaml(text, where, TenantsError)
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise TenantsError(f"{where} must map tenant names to {{datasets, cache_share}}")
    tenants: dict[str, Tenant] = {}
    for name, entry in sorted(loaded.items(), key=lambda item: str(item[0])):
        if not isinstance(name, str) or not name or not isinstance(entry, dict):
            raise TenantsError(f"{where}: {name!r} must map to {{datasets, cache_share}}")
        unknown = set(entry) - {"datasets", "cache_share", "link_share"}
        if unknown:
            raise TenantsError(f"{where}: {name} has unknown keys {sorted(unknown)}")
        datasets = entry.get("datasets")
        if (
            not isinstance(datasets, list)
            or not datasets
            or not all(isinstance(d, str) and d for d in datasets)
        ):
            raise TenantsError(f"{where}: {name} must list its datasets")
        shares = {}
        for key in ("cache_share", "link_share"):
            value = entry.get(key, 0.0)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TenantsError(f"{where}: {name}'s {key} must be a number")
            if not 0 <= value <= 1:
                raise TenantsError(f"{where}: {name}'s {key} {value} is outside [0, 1]")
            shares[key] = float(value)
        tenants[name] = Tenant(name, tuple(datasets), **shares)
    for key in ("cache_share", "link_share"):
        total = sum(getattr(t, key) for t in tenants.values())
        if total > 1 + 1e-9:
            raise TenantsError(f"{where}: the tenants' {key}s sum to {total:g}, above 1")
    return tenants


class Keeper:
    """For one eviction batch made for ``tenant`` (None: for nobody): the blocks it must
    pass over, and the victims it took so far (so a batch cannot take a tenant below its
    share one victim at a time). Called with a digest: True to keep it."""

    def __init__(self, shares: TenantShares, tenant: str | None) -> None:
        self._shares = shares
        self.tenant = tenant
        self._taken: Counter[str] = Counter()

    def __call__(self, digest: str) -> bool:
        owned = self._shares.owner(digest)
        if owned is None or owned[0] == self.tenant:
            return False
        tenant, size = owned
        floor = self._shares.share_bytes(tenant)
        return self._shares.resident_bytes(tenant) - self._taken[tenant] - size < floor

    def took(self, digest: str, size: int) -> None:
        """``digest`` was taken as a victim in this batch."""
        owned = self._shares.owner(digest)
        if owned is not None:
            self._taken[owned[0]] += size

    def settled(self) -> None:
        """The batch's victims are gone (their tenants' bytes count it now)."""
        self._taken.clear()


class TenantShares:
    """Whose each resident block is, each tenant's resident bytes, and the shares.

    Args:
        path: the tenants file (re-read when it changes; a change that does not parse
            keeps the last good table).
        capacity_bytes: the cache size the shares are fractions of.
        datasets_of: the datasets holding each digest (the block scope index's lookup);
            may be bound after construction (:attr:`datasets_of`), before any admission.

    Raises:
        TenantsError: the file cannot be read or does not parse at start.
    """

    def __init__(
        self, path: Path, capacity_bytes: int, datasets_of: DatasetsOf | None = None
    ) -> None:
        self.path = path
        self.capacity_bytes = capacity_bytes
        self.datasets_of = datasets_of
        try:
            self._file: ReloadingFile[dict[str, Tenant]] = ReloadingFile(
                path, parse, {}, required=True
            )
        except TenantsError:
            raise
        except ValueError as err:  # unreadable
            raise TenantsError(str(err)) from None
        self._owner: dict[str, tuple[str, int]] = {}  # resident digest -> tenant, size
        self._resident: Counter[str] = Counter()

    def tenants(self) -> dict[str, Tenant]:
        """The tenants now (the file re-read if it changed)."""
        return self._file.current()

    def tenant_of_datasets(self, datasets: Iterable[str]) -> str | None:
        """The first tenant (by name) holding any of ``datasets``, or None."""
        names = list(datasets)
        for tenant in self.tenants().values():
            if any(tenant.holds(d) for d in names):
                return tenant.name
        return None

    def attribute(self, digests: Sequence[str]) -> dict[str, str]:
        """The tenant of each of ``digests`` some tenant's live snapshot holds."""
        if self.datasets_of is None or not digests:
            return {}
        out = {}
        for digest, datasets in self.datasets_of(digests).items():
            tenant = self.tenant_of_datasets(datasets)
            if tenant is not None:
                out[digest] = tenant
        return out

    def owner(self, digest: str) -> tuple[str, int] | None:
        """``(tenant, size)`` of a resident block some tenant owns."""
        return self._owner.get(digest)

    def resident_bytes(self, tenant: str) -> int:
        """Bytes of ``tenant``'s resident blocks."""
        return self._resident[tenant]

    def share_bytes(self, tenant: str) -> int:
        """The bytes ``tenant``'s share keeps from other tenants' evictions."""
        found = self.tenants().get(tenant)
        return int(found.cache_share * self.capacity_bytes) if found is not None else 0

    def keeper(self, digest: str | None = None) -> Keeper:
        """The keeper of an eviction batch made for ``digest``'s admission (its tenant's),
        or for nobody (the background evictor)."""
        tenant = None
        if digest is not None:
            tenant = self.attribute([digest]).get(digest)
        return Keeper(self, tenant)

    def admitted(self, digest: str, size: int, tenant: str | None) -> None:
        """``digest`` (``size`` bytes) is resident: its ``tenant`` (:attr:`Keeper.tenant`
        of its admission), if any, owns it."""
        if tenant is not None and digest not in self._owner:
            self._owner[digest] = (tenant, size)
            self._resident[tenant] += size
            metrics.TENANT_ADMITTED_BYTES.labels(tenant).inc(size)
            metrics.TENANT_RESIDENT_BYTES.labels(tenant).set(self._resident[tenant])

    def restore(self, resident: Mapping[str, int]) -> None:
        """At start: own every resident block (digest -> size) a tenant's snapshot holds."""
        for digest, tenant in self.attribute(list(resident)).items():
            if digest not in self._owner:
                self._owner[digest] = (tenant, resident[digest])
                self._resident[tenant] += resident[digest]
        for tenant, nbytes in self._resident.items():
            metrics.TENANT_RESIDENT_BYTES.labels(tenant).set(nbytes)

    def removed(self, digest: str) -> None:
        """``digest`` left the cache (evicted or dropped)."""
        owned = self._owner.pop(digest, None)
        if owned is not None:
            tenant, size = owned
            self._resident[tenant] -= size
            metrics.TENANT_RESIDENT_BYTES.labels(tenant).set(self._resident[tenant])

    def reads(self, digests: Sequence[str], hit: bool) -> None:
        """The access log's subscriber: readers read ``digests`` (hits or misses)."""
        outcome = "hit" if hit else "miss"
        known = {d: o[0] for d in digests if (o := self._owner.get(d)) is not None}
        rest = [d for d in digests if d not in known]
        counts = Counter(known.values()) + Counter(self.attribute(rest).values())
        for tenant, n in counts.items():
            metrics.TENANT_READS.labels(tenant, outcome).inc(n)

    def snapshot(self) -> dict[str, dict[str, int | float]]:
        """JSON-ready per tenant: share and resident bytes, the shares as fractions."""
        return {
            name: {
                "cache_share": t.cache_share,
                "link_share": t.link_share,
                "share_bytes": self.share_bytes(name),
                "resident_bytes": self._resident[name],
            }
            for name, t in self.tenants().items()
        }
