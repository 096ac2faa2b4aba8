"""What the block cache tells an arriving block's admission: how it is placed
(:class:`Placement`) and the refusals (:class:`CacheFull`, :class:`PrefetchRefused`) on
which its caller streams the block through uncached. The cache that decides is
:mod:`spoke.cache.blockcache`.
"""

from __future__ import annotations

from enum import Enum


class CacheFull(OSError):
    """No room on the cache filesystem and nothing evictable (everything pinned)."""


class PrefetchRefused(CacheFull):
    """A block fetched ahead of its readers finds no free room (it would make the cache
    evict a block the policy ranks above it)."""


class Placement(Enum):
    """How an arriving block is admitted."""

    DEMAND = "demand"  # a reader (or an operator) asked: the policy places it, it may evict
    AHEAD = "ahead"  # readahead, fill: the cold end, only into free room, evicting nothing
    HINTED = "hinted"  # a hinted prefetch: the cold end; the hinted policy picks its room
