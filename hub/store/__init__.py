"""Where a hub keeps its bytes: the blob store (:mod:`~hub.store.blobstore`, local, or
S3-compatible in :mod:`~hub.store.s3blobs`), the data directory's layout and private
modes (:mod:`~hub.store.datadir`), garbage collection (:mod:`~hub.store.gc`), proving a
version is what was published (:mod:`~hub.store.verify`) and moving an embedded catalog
into a shared one (:mod:`~hub.store.migrate`). It imports :mod:`hub.catalog`,
:mod:`hub.snapshot` and the ground leaves.
"""
