"""The block cache: block files and their index (:mod:`~spoke.cache.store`), the cache
that admits, pins and evicts them under its watermarks (:mod:`~spoke.cache.blockcache`),
with an admission's placement and refusals (:mod:`~spoke.cache.admission`) and the hits'
recency batched to the index (:mod:`~spoke.cache.recency`),
the eviction policies (:mod:`~spoke.cache.policy` and its subclasses in
:mod:`~spoke.cache.lru`, :mod:`~spoke.cache.arc`, :mod:`~spoke.cache.sieve`,
:mod:`~spoke.cache.s3fifo`, named for ``--policy`` in :mod:`~spoke.cache.registry`), and
the hinted policy that follows the readers' planned reads (:mod:`~spoke.cache.hinted`,
following the streams in :mod:`~spoke.cache.hintfollow`, over
:mod:`~spoke.cache.hintstream` and :mod:`~spoke.cache.hintplan`), the batched
block writes (:mod:`~spoke.cache.writer`), and blocks staged by fetch threads before
admission (:mod:`~spoke.cache.staging`). It knows nothing of where blocks come from; it
imports only :mod:`spoke.disk` and the top-level leaves.
"""
