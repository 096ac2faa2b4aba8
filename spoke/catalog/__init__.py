"""What the spoke knows of the hub's datasets: the snapshot catalog it keeps so that
snapshots seen before stay usable while the hub is down (:mod:`~spoke.catalog.catalog`),
the checks it makes of what the hub says (:mod:`~spoke.catalog.manifestcheck`,
:mod:`~spoke.catalog.signature`), which files a request means
(:mod:`~spoke.catalog.selection`), which stored snapshots hold a block
(:mod:`~spoke.catalog.blockscope`) and which snapshots the mount has loaded
(:mod:`~spoke.catalog.snapshots`). It imports :mod:`spoke.hublink` and the rooms below
it.
"""
