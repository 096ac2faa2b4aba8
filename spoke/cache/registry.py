"""The eviction policies by their ``--policy`` names, and the default.

``arc`` lives in :mod:`spoke.cache.arc`, ``lru`` in :mod:`spoke.cache.lru`, ``sieve`` in
:mod:`spoke.cache.sieve`, ``s3fifo`` in :mod:`spoke.cache.s3fifo`; all are byte-weighted
(:mod:`spoke.cache.policy`) and can be wrapped by :class:`spoke.cache.hinted.HintedPolicy`.
How the default was chosen: ``spoke/DESIGN.md``.
"""

from __future__ import annotations

from spoke.cache.arc import ARCPolicy
from spoke.cache.lru import LRUPolicy
from spoke.cache.policy import EvictionPolicy
from spoke.cache.s3fifo import S3FIFOPolicy
from spoke.cache.sieve import SIEVEPolicy

POLICIES: dict[str, type[EvictionPolicy]] = {
    "arc": ARCPolicy,
    "lru": LRUPolicy,
    "s3fifo": S3FIFOPolicy,
    "sieve": SIEVEPolicy,
}

DEFAULT_POLICY = "sieve"  # chosen by measurement: spoke/DESIGN.md


def make_policy(name: str, capacity_bytes: int = 0) -> EvictionPolicy:
    """Build a policy by its command-line name (one of :data:`POLICIES`).

    Args:
        name: ``arc``, ``lru``, ``s3fifo`` or ``sieve``.
        capacity_bytes: the bytes it may keep resident; leave it out for a policy given to
            a :class:`~spoke.cache.blockcache.BlockCache`, which sizes its policy itself
            (to ``--cache-size`` less the pinned bytes).

    Raises:
        ValueError: unknown policy name, or a negative capacity.
    """
    try:
        cls = POLICIES[name]
    except KeyError:
        choices = ", ".join(sorted(POLICIES))
        raise ValueError(f"unknown cache policy {name!r} (choose: {choices})") from None
    return cls(capacity_bytes)
