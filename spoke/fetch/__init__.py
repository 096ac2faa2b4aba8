"""Getting blocks that are not in the cache: the request classes
(:mod:`~spoke.fetch.priority`), what a source of blocks is (:mod:`~spoke.fetch.source`:
each call carries its blocks' sizes and class), the fetcher that runs one batch against a
source and puts what arrives into the cache, owning every deadline
(:mod:`~spoke.fetch.fetcher`, :mod:`~spoke.fetch.deadlines`), the scheduler that every
fetch goes through (:mod:`~spoke.fetch.scheduler`) over the single-flight table and its
byte counts (:mod:`~spoke.fetch.flights`) and the pacer (:mod:`~spoke.fetch.pacer`, with
the link window, :mod:`~spoke.fetch.window`), and the prefetch ledger
(:mod:`~spoke.fetch.ledger`, an access-log subscriber). It knows no hub (the hub is one
source, in :mod:`spoke.hublink`); it imports :mod:`spoke.cache`, :mod:`spoke.disk` and the
top-level leaves.
"""
