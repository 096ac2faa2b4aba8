"""Fetching ahead of the readers: read-order hints and the readahead that follows them
(:mod:`~spoke.prefetch.hints`, with what a post may hold in
:mod:`~spoke.prefetch.hintcaps`), background fill of a snapshot being read
(:mod:`~spoke.prefetch.fill`) and prewarm jobs (:mod:`~spoke.prefetch.prewarm`). Each
fetches through :mod:`spoke.fetch`'s scheduler at its own priority. It imports
:mod:`spoke.upkeep` and the rooms below it, never :mod:`spoke.mesh` (its sibling).
"""
