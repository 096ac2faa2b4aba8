"""Keeping the cache true and within bounds over time: following the hub's catalog events
(:mod:`~spoke.upkeep.invalidation`), evicting snapshots nobody reads any more
(:mod:`~spoke.upkeep.retention`) and the pins that keep blocks out of eviction
(:mod:`~spoke.upkeep.pins`). It imports :mod:`spoke.catalog` and the rooms below it.
"""
