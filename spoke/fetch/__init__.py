"""Getting blocks that are not in the cache: what a source of blocks is
(:mod:`~spoke.fetch.source`), the fetcher that runs one batch against a source and puts
what arrives into the cache (:mod:`~spoke.fetch.fetcher`), the scheduler that every fetch
goes through — single flight, priorities, bytes on the wire (:mod:`~spoke.fetch.scheduler`,
paced by :mod:`~spoke.fetch.window`) — and the prefetch ledger
(:mod:`~spoke.fetch.ledger`). It knows no hub (the hub is one source, in
:mod:`spoke.hublink`); it imports :mod:`spoke.cache`, :mod:`spoke.disk` and the top-level
leaves.
"""
