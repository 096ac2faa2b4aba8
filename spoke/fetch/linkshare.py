"""Tenants' shares of the link (``--tenants``' ``link_share``, :mod:`spoke.cache.tenants`):
while another tenant misses, a tenant's fetches of every class but demand keep to its
share of the fetch window — and fetches of datasets no tenant names, together, to what
the tenants' shares leave.

"Misses" means has demand wanted or on the wire, or had within :data:`DEMAND_RECENT_S`: a
reader reading file after file is between misses most of the time, and a window refilled
in each gap would queue its next miss behind another tenant's prefetch. Lives held by
their share stay queued (:meth:`spoke.fetch.life.BlockLives.take`); when only recent
demand holds them, a pump is due when it runs out (nothing else may wake the scheduler).

Everything runs on the daemon's event loop (no locks).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from spoke.cache.tenants import TenantShares
from spoke.fetch.life import BlockLives
from spoke.fetch.lifestate import Event, Life
from spoke.fetch.priority import Priority

DEMAND_RECENT_S = 1.0
"""How long after another tenant's demand miss left a tenant's prefetch keeps to its
``link_share``, seconds."""


class LinkShares:
    """Who may put a non-demand life on the wire now.

    Args:
        tenants: the tenants and their shares.
        lives: every block's life (their demand counts and bytes on the wire by tenant).
        window: the link window's size now, bytes.
        pump: starts what may start (called when recent demand runs out).
    """

    def __init__(
        self,
        tenants: TenantShares,
        lives: BlockLives,
        window: Callable[[], int],
        pump: Callable[[], None],
    ) -> None:
        self.tenants = tenants
        self._lives = lives
        self._window = window
        self._pump = pump
        self._demand_seen: dict[str | None, float] = {}  # tenant -> loop time of a demand
        self._recheck: asyncio.TimerHandle | None = None

    def hear(self, event: Event, life: Life) -> None:
        """A subscriber of the lives: when each tenant's demand last left."""
        if event is Event.SENT and life.priority == Priority.DEMAND:
            self._demand_seen[life.tenant] = asyncio.get_running_loop().time()

    def allows(self, life: Life) -> bool:
        """Whether ``life`` (of a class other than demand) may go on the wire now."""
        tenant = life.tenant  # None: a dataset no tenant names
        loop = asyncio.get_running_loop()
        now = loop.time()
        missing = any(n > 0 for who, n in self._lives.demand.items() if who != tenant)
        recent = [
            t + DEMAND_RECENT_S
            for who, t in self._demand_seen.items()
            if who != tenant and t + DEMAND_RECENT_S > now
        ]
        if not missing and not recent:
            return True
        named = self.tenants.tenants()
        if tenant is None:  # what no tenant's share holds (it went unbounded before: the
            # eighteenth probe's untenanted prewarm ran 2.7 times faster than a tenant's)
            fraction = max(0.0, 1.0 - sum(t.link_share for t in named.values()))
        else:
            found = named.get(tenant)
            fraction = found.link_share if found is not None else 0.0
        share = fraction * self._window()
        allowed = self._lives.ahead_wire[tenant] + life.size <= share
        if not allowed and not missing and self._recheck is None:
            self._recheck = loop.call_later(max(min(recent) - now, 0.0), self._recheck_now)
        return allowed

    def close(self) -> None:
        """Drop a pending recheck."""
        if self._recheck is not None:
            self._recheck.cancel()
            self._recheck = None

    def _recheck_now(self) -> None:
        self._recheck = None
        self._pump()
