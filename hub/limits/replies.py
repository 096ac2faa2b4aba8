"""The bytes of replies waiting for their clients, per token and in all.

A unary reply (a ``ListDirectory`` page) or a ``GetManifest`` message stays at the hub
until its client's HTTP/2 window takes it; a client that never opens its window keeps it.
Slots bound how many such replies a token holds (:mod:`hub.limits.streams`), pages are
cut by bytes (``hub/serve``), but one manifest entry is as large as its block list: a
file of 50,000 blocks is a 3.8 MB entry, and issue 39's sixth probe held 16 such listings
from one token (the hub past its 1 GiB limit) and 24 tokens' worth in waves (1,958 MiB).
So each waiting reply is charged :data:`COPIES` times its size (measured: a 4.1 MB reply
held 12.3 MiB unread: the message, its serialized bytes and gRPC core's frame) until it
has left or its call ended (:class:`ReplyBytes`): at most :data:`PER_TOKEN` for one token
and :data:`TOTAL` for all, one reply of any size passing alone when its token (or the
hub) holds nothing else. Beyond, the call is refused ``RESOURCE_EXHAUSTED``
(``limit="replies"``), counted and audited like the other limits.
"""

from __future__ import annotations

import collections

from hub.errors import QuotaExceeded
from hub.snapshot.blocks import MiB

COPIES = 3
"""A waiting reply holds about this many times its serialized size."""

PER_TOKEN = 16 * MiB
"""Most reply bytes (charged) one token's unread replies may hold."""

TOTAL = 128 * MiB
"""Most reply bytes (charged) every token's unread replies may hold together."""

SMALL = 64 * 1024
"""Replies smaller than this are not charged: their number is bounded by the call slots
(:mod:`hub.limits.streams`), and a full reply budget must not refuse every token's
``ResolveRef`` or grant renewal."""


class ReplyBytes:
    """Charges for replies waiting for their clients; used from one event loop.

    Args:
        per_token: Most charged bytes one token may hold.
        total: Most charged bytes all tokens may hold.
    """

    def __init__(self, per_token: int = PER_TOKEN, total: int = TOTAL) -> None:
        self.per_token, self.total = per_token, total
        self.held = 0
        self._held: collections.Counter[str] = collections.Counter()

    def held_by(self, name: str) -> int:
        """Charged bytes of ``name``'s waiting replies."""
        return self._held[name]

    def check(self, name: str) -> None:
        """Refuse a call of ``name``'s before its reply is built when its own share is
        spent already (building a reply of a large entry costs as much as holding it); the
        hub's total is left to :meth:`take`, so a full total refuses large replies, never a
        token's small calls before they are built.

        Raises:
            QuotaExceeded: ``name`` holds its share.
        """
        mine = self._held[name]
        if mine >= self.per_token:
            raise QuotaExceeded(
                "replies",
                f"replies waiting for their clients hold {self.held} bytes at this hub "
                f"({mine} for token {name}), at most {self.per_token} a token and "
                f"{self.total} in all: read the replies already sent, or retry",
            )

    def take(self, name: str, size: int) -> int:
        """Charge a reply of ``size`` serialized bytes to ``name``; returns the charge, for
        :meth:`release` (0 for a reply under :data:`SMALL`).

        Raises:
            QuotaExceeded: ``name``'s share or the hub's total would be passed (a reply
                passes alone when its token, or every token, holds nothing).
        """
        if size < SMALL:
            return 0
        charge = COPIES * size
        mine = self._held[name]
        if (mine and mine + charge > self.per_token) or (
            self.held and self.held + charge > self.total
        ):
            raise QuotaExceeded(
                "replies",
                f"replies waiting for their clients hold {self.held} bytes at this hub "
                f"({mine} for token {name}); this one would add {charge}, beyond "
                f"{self.per_token} a token or {self.total} in all: read the replies "
                "already sent, or retry",
            )
        self._held[name] += charge
        self.held += charge
        return charge

    def release(self, name: str, charge: int) -> None:
        """Give back a charge :meth:`take` made for ``name``."""
        if not charge:
            return
        self.held -= charge
        self._held[name] -= charge
        if self._held[name] <= 0:
            del self._held[name]
