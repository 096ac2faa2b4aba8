"""Tenants' shares of the link (``--tenants``' ``link_share``, :mod:`spoke.cache.tenants`):
while another tenant misses, a tenant's fetches of every class but demand keep to its
share of the fetch window and of the link's rate — and fetches of datasets no tenant
names, together, to what the tenants' shares leave.

"Misses" means has demand wanted or on the wire, or had within :data:`DEMAND_RECENT_S`: a
reader reading file after file is between misses most of the time, and a window refilled
in each gap would queue its next miss behind another tenant's prefetch. Lives held by
their share stay queued (:meth:`spoke.fetch.life.BlockLives.take`); a timer pumps the
scheduler when recent demand runs out or a held tenant's rate has room again (nothing
else may wake it).

**Two limits.** The share of the window bounds bytes on the wire; on a short round trip
the window's floor is many times the link's bandwidth-delay product, and a share of it
no limit on the rate: issue 39's eighteenth probe saw a tenant at ``link_share`` 0.2
prewarm at the loopback's full 47 MB/s while another tenant's 256 KiB misses took p50
0.36 s instead of 18 ms, the daemon's CPU being what the prewarm took. So the share is
of the rate too: a token bucket per tenant, filled at ``link_share`` × the link's rate,
holding at most its share of the window. The link's rate is the highest measured
lately (:attr:`LinkShares.reference`), kept while shares hold (the rate measured then is
the held rate, and a limit sized by it would shrink with every second of holding), and
at least :data:`RATE_FLOOR_BPS`.
A tenant with nothing on the wire and room in its bucket may send one block, whatever
its share of the window; and every share is at least :data:`LEAST_SHARE`.

Everything runs on the daemon's event loop (no locks).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

from spoke.cache.tenants import Tenant, TenantShares
from spoke.fetch.life import BlockLives
from spoke.fetch.lifestate import Event, Life
from spoke.fetch.priority import Priority
from spoke.fetch.window import LinkWindow

DEMAND_RECENT_S = 1.0
"""How long after another tenant's demand miss left a tenant's prefetch keeps to its
``link_share``, seconds."""

RATE_FLOOR_BPS = 125e6
"""Least link rate a share is a fraction of, bytes/s (1 Gbit/s, the link the window's floor
assumes, :data:`spoke.fetch.window.FLOOR_BYTES`): the spoke knows only the rates it has
delivered, and one that has delivered only a light reader's misses would hold another
tenant's prewarm to a share of those — a share of a share, for as long as that reader
reads. On a slower link the window's share is the limit, as before."""

LEAST_SHARE = 0.01
"""The share of the link every tenant (and the datasets no tenant names) keeps while
another tenant misses, whatever its ``link_share`` (0 when the key is left out): issue
39's nineteenth probe saw a prewarm at a share of 0 move no byte for as long as another
team read (26.7 s; 2.1 s alone)."""

GRAINS = 4
"""A held tenant's bucket lets a batch start once it holds a 1/GRAINS of the tenant's
window share (or one block): one block a stream as soon as a block's bytes were in made
the rate limit a stream per block, each costing the hub and the daemon about 1 ms of CPU
(a prewarm at ``link_share`` 0.2 then slowed another tenant's misses more than one at
1)."""

REFERENCE_HALF_LIFE_S = 300.0
"""How fast the link's reference rate forgets a higher rate while no share holds
anything back, seconds (halved each; it never falls while shares hold)."""


class _Room:
    """A held tenant's room in one gate: bytes it may still put on the wire, and its
    bucket's bytes (it may send while they are above 0)."""

    __slots__ = ("bucket", "grain", "rate", "sending", "share", "wire")

    def __init__(self, wire: float, bucket: float, rate: float, share: float) -> None:
        self.wire = wire
        self.bucket = bucket
        self.rate = rate  # bytes/s the bucket fills at
        self.share = share  # bytes the bucket holds at most (the tenant's window share)
        self.grain = share / GRAINS  # bytes the bucket holds before a batch may start
        self.sending = False  # a life went in this gate: the batch goes on while bytes last


class LinkShares:
    """Who may put a non-demand life on the wire now.

    Args:
        tenants: the tenants and their shares.
        lives: every block's life (their demand counts and bytes on the wire by tenant).
        window: the link's window estimator (its window and delivery rate).
        pump: starts what may start (called when a held tenant may go again).
    """

    def __init__(
        self,
        tenants: TenantShares,
        lives: BlockLives,
        window: LinkWindow,
        pump: Callable[[], None],
    ) -> None:
        self.tenants = tenants
        self._lives = lives
        self._window = window
        self._pump = pump
        self._demand_seen: dict[str | None, float] = {}  # tenant -> loop time of a demand
        self._buckets: dict[str | None, tuple[float, float]] = {}  # tenant -> bytes, as of
        self._recheck: asyncio.TimerHandle | None = None
        self._held_at = -math.inf  # loop time a share last held a life back
        self._reference_at = 0.0  # loop time of the last update of the reference
        self.reference: float | None = None
        """The link's rate the shares are fractions of, bytes/s: the highest delivery
        rate measured (:attr:`~spoke.fetch.window.LinkWindow.rate_bps`), forgotten by
        half every :data:`REFERENCE_HALF_LIFE_S` while no share has held a life back for
        the rate's span, and never while one has (held, the link delivers what the
        shares let through, and a reference that followed it would shrink the shares
        with every second of holding)."""

    def reference_rate(self, now: float) -> float | None:
        """:attr:`reference` as of ``now`` (loop seconds); None before any sample."""
        window = self._window
        rate = window.rate_bps or 0.0
        reference = self.reference
        if reference is not None and now - self._held_at > window.rate_span_s:
            reference *= 0.5 ** ((now - self._reference_at) / REFERENCE_HALF_LIFE_S)
        if reference is not None or rate:
            self.reference = max(reference or 0.0, rate)
            self._reference_at = now
        return self.reference

    def hear(self, event: Event, life: Life) -> None:
        """A subscriber of the lives: when each tenant's demand last left."""
        if event is Event.SENT and life.priority == Priority.DEMAND:
            self._demand_seen[life.tenant] = asyncio.get_running_loop().time()

    def gate(self) -> Callable[[Life], bool]:
        """Whether each life (of a class other than demand) may go on the wire now: one
        gate per :meth:`~spoke.fetch.life.BlockLives.take`, which asks it of every queued
        life it passes over.

        The gate reads the tenants, the demand and the window once, and keeps each
        tenant's room as it lets lives through (the life's move to the wire counts its
        bytes): the eighteenth probe's case, profiled, had the daemon's loop half spent
        asking, for each of up to :data:`~spoke.fetch.life.HELD_SCAN` held lives on every
        arrival, a stat of the tenants file and every tenant's demand.
        """
        loop = asyncio.get_running_loop()
        now = loop.time()
        rooms: dict[str | None, _Room | None] = {}  # tenant -> its room (None: not held)
        ends: dict[str | None, float] = {}  # tenant held by recent demand only -> until
        named: dict[str, Tenant] | None = None

        def room(tenant: str | None) -> _Room | None:
            nonlocal named
            missing = any(n > 0 for who, n in self._lives.demand.items() if who != tenant)
            recent = [
                t + DEMAND_RECENT_S
                for who, t in self._demand_seen.items()
                if who != tenant and t + DEMAND_RECENT_S > now
            ]
            if not missing and not recent:
                self._buckets.pop(tenant, None)  # full when it is held next
                return None
            if not missing:
                ends[tenant] = min(recent)
            if named is None:
                named = self.tenants.tenants()
            if tenant is None:  # what no tenant's share holds (it went unbounded before:
                # the eighteenth probe's untenanted prewarm ran 2.7 times faster than a
                # tenant's)
                fraction = max(0.0, 1.0 - sum(t.link_share for t in named.values()))
            else:
                found = named.get(tenant)
                fraction = found.link_share if found is not None else 0.0
            fraction = max(fraction, LEAST_SHARE)
            share = fraction * self._window.bytes
            reference = max(self.reference_rate(now) or 0.0, RATE_FLOOR_BPS)
            rate = fraction * reference
            bucket, since = self._buckets.get(tenant, (share, now))
            bucket = min(share, bucket + rate * (now - since))
            return _Room(share - self._lives.ahead_wire[tenant], bucket, rate, share)

        def allows(life: Life) -> bool:
            tenant = life.tenant  # None: a dataset no tenant names
            if tenant not in rooms:
                rooms[tenant] = room(tenant)
            held = rooms[tenant]
            if held is None:
                return True
            first = self._lives.ahead_wire[tenant] == 0  # one block at least
            grain = min(max(held.grain, life.size), held.share)  # a full bucket will do
            filled = held.bucket > 0 if held.sending else held.bucket >= grain
            if (life.size <= held.wire or first) and filled:
                held.wire -= life.size
                held.bucket -= life.size
                held.sending = True
                self._buckets[tenant] = (held.bucket, now)
                return True
            self._held_at = now
            if tenant in ends:  # nothing else wakes the pump when recent demand ends
                self._wake(loop, ends[tenant])
            if not filled and held.rate > 0:
                self._wake(loop, now + (grain - held.bucket) / held.rate)
            return False

        return allows

    def close(self) -> None:
        """Drop a pending recheck."""
        if self._recheck is not None:
            self._recheck.cancel()
            self._recheck = None

    def _wake(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        """Pump at loop time ``when``, unless an earlier pump is due."""
        if self._recheck is not None:
            if self._recheck.when() <= when:
                return
            self._recheck.cancel()
        self._recheck = loop.call_at(when, self._recheck_now)

    def _recheck_now(self) -> None:
        self._recheck = None
        self._pump()
