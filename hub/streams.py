"""How many ``GetManifest`` and ``Watch`` streams the hub keeps open, per token and in all.

A response stream its client does not read holds what the hub has prepared for it: a
stalled ``GetManifest`` keeps a serialized page of the catalog and the page read ahead
(about 215 KiB for 256 entries of 250-byte paths), a ``Watch`` about 26 KiB of gRPC
state. ``ReadBlocks`` streams are bounded by their bytes (:mod:`hub.budget`); these two by
their number (:class:`StreamSlots`):

- ``GetManifest``: at most :data:`MANIFEST_STREAMS` at once (256: about 55 MiB stalled),
  one token at most an eighth of them. A manifest is read in well under a second, so a
  stream without a slot *waits* for one, first come first served, up to
  :data:`~hub.budget.WAIT_S`, then is refused; the spokes of a region asking for a new
  snapshot's manifest at once queue for seconds instead of failing. Waiting streams hold
  no page; one token may have at most four times its slots waiting, beyond which it is
  refused at once.
- ``Watch``: at most :data:`WATCH_STREAMS` at once (8,192: about 210 MiB), one token at
  most an eighth. A spoke holds one for as long as it runs, so a stream without a slot is
  refused at once (it retries with backoff).

With the read budget's 384 MiB and a serving hub's 143 MiB that keeps stalled clients of
every kind at about 790 MiB, under the shipped Deployment's 1 GiB. Refusals are
:class:`~hub.errors.QuotaExceeded` (``RESOURCE_EXHAUSTED``, ``limit="streams"``), counted
and audited like the budget's.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator

from hub.errors import QuotaExceeded

MANIFEST_STREAMS = 256
"""Default most ``GetManifest`` streams open at once (``--max-manifest-streams``)."""

WATCH_STREAMS = 8192
"""Default most ``Watch`` streams open at once (``--max-watch-streams``): a spoke holds one."""

TOKEN_SHARE = 8
"""One token may hold at most 1/``TOKEN_SHARE`` of a kind's slots."""

WAITING_PER_SLOT = 4
"""A token may have at most this many streams waiting per slot it may hold."""


class StreamSlots:
    """Open streams of one kind, per principal and in total; used from one event loop.

    Args:
        kind: The RPC's name, for messages (``GetManifest``).
        flag: The flag that sets ``total``, for messages.
        total: Most streams open at once.
        wait_s: Longest a stream waits for a slot, seconds (0: refused at once).
    """

    def __init__(self, kind: str, flag: str, total: int, wait_s: float = 0.0) -> None:
        if total < TOKEN_SHARE or wait_s < 0:
            raise ValueError(f"{flag} must be at least {TOKEN_SHARE}, got {total}")
        self.kind = kind
        self.flag = flag
        self.total = total
        self.per_token = total // TOKEN_SHARE
        self.wait_s = wait_s
        self.open = 0
        self._open: collections.Counter[str] = collections.Counter()
        self._waiting: collections.Counter[str] = collections.Counter()
        self._freed = asyncio.Condition()

    def open_by(self, name: str) -> int:
        """Streams principal ``name`` has open."""
        return self._open[name]

    def _free_for(self, name: str) -> bool:
        return self.open < self.total and self._open[name] < self.per_token

    @contextlib.asynccontextmanager
    async def slot(self, name: str) -> AsyncIterator[None]:
        """Holds one of the slots for principal ``name`` for the ``async with`` block,
        waiting up to :attr:`wait_s` for one.

        Raises:
            QuotaExceeded: no slot within the wait, or too many of ``name``'s waiting.
        """
        if not self._free_for(name):
            await self._wait(name)
        self.open += 1
        self._open[name] += 1
        try:
            yield
        finally:
            self.open -= 1
            self._open[name] -= 1
            if not self._open[name]:
                del self._open[name]
            async with self._freed:
                self._freed.notify_all()

    async def _wait(self, name: str) -> None:
        if self.wait_s <= 0 or self._waiting[name] >= WAITING_PER_SLOT * self.per_token:
            self._refuse(name)
        self._waiting[name] += 1
        try:
            async with self._freed:
                await asyncio.wait_for(
                    self._freed.wait_for(lambda: self._free_for(name)), self.wait_s
                )
        except TimeoutError:
            self._refuse(name)
        finally:
            self._waiting[name] -= 1
            if not self._waiting[name]:
                del self._waiting[name]

    def _refuse(self, name: str) -> None:
        mine = self._open[name]
        raise QuotaExceeded(
            "streams",
            f"{self.open} {self.kind} streams are open ({mine} for token {name}); this hub "
            f"keeps at most {self.total} ({self.flag}), {self.per_token} per token: finish "
            "or cancel some, or retry",
        )
