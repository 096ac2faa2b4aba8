"""Getting blocks that are not in the cache: the request classes and prefetch sources
(:mod:`~spoke.fetch.priority`), what a source of blocks is (:mod:`~spoke.fetch.source`:
each call carries its blocks' sizes and class), each block's life from wanted to resident
(:mod:`~spoke.fetch.life`: one state machine per digest that owns its waiters, placement,
whether it was read and every byte count, and tells its subscribers; its states, events
and the life record in :mod:`~spoke.fetch.lifestate`), the fetcher that runs
one batch against a source, owning every deadline (:mod:`~spoke.fetch.fetcher`,
:mod:`~spoke.fetch.deadlines`), and writes through a sink into the cache
(:mod:`~spoke.fetch.sink`), the scheduler that every fetch goes through
(:mod:`~spoke.fetch.scheduler`) with the pacer (:mod:`~spoke.fetch.pacer`, with the link
window, :mod:`~spoke.fetch.window`, and demand misses gathering onto one stream,
:mod:`~spoke.fetch.gather`), and the prefetch ledger (:mod:`~spoke.fetch.ledger`, a
subscriber of the lives). It knows no hub (the hub is one source, in
:mod:`spoke.hublink`); it imports :mod:`spoke.cache`, :mod:`spoke.disk` and the top-level
leaves.
"""
