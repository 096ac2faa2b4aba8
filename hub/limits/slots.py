"""Which stream slots a token may take: every kind's last slots are kept for tokens holding
few (:func:`slot_free`), for ``ReadBlocks`` (:mod:`hub.limits.budget`) and the other
kinds (:mod:`hub.limits.streams`) alike.
"""

from __future__ import annotations

RESERVED_SHARE = 8
"""The last 1/``RESERVED_SHARE`` of the hub's stream slots (of each kind: ``ReadBlocks``
here, the others in :mod:`hub.limits.streams`) go only to tokens holding fewer than
:data:`RESERVED_BELOW` streams of that kind: tokens that fill the rest (four tokens at
their 512 ``ReadBlocks`` streams each, header-only and re-opened as they time out, would
fill 2,048) cannot lock the other tokens out."""

RESERVED_BELOW = 16
"""A token holding fewer streams of a kind than this (and than a quarter of its own
share, :func:`reserved_below`) may take the reserved slots: a spoke opens at most 16
block streams (``spoke.fetch.scheduler``)."""


def reserved_below(per_token: int) -> int:
    """Below how many streams a token may take reserved slots: :data:`RESERVED_BELOW`, or a
    quarter of ``per_token`` when that is fewer (a kind whose share is 16, ``ListDirectory``'s,
    would otherwise let every token under its share into the reserve), at least 1."""
    return max(1, min(RESERVED_BELOW, per_token // 4))


def reserved_slots(total: int) -> int:
    """How many of ``total`` slots are kept for tokens holding few (:data:`RESERVED_SHARE`)."""
    return total // RESERVED_SHARE


def slot_free(total: int, open_: int, mine: int, per_token: int) -> bool:
    """Whether a token holding ``mine`` of a kind's ``open_`` slots may take one more:
    under ``total`` and its ``per_token``, and, in the reserved last slots
    (:func:`reserved_slots`), only while it holds fewer than :func:`reserved_below`."""
    if open_ >= total or mine >= per_token:
        return False
    return open_ < total - reserved_slots(total) or mine < reserved_below(per_token)
