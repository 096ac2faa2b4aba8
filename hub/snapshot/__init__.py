"""What a snapshot is, whatever stores or serves it: the naming rules for datasets, tags,
versions and digests (:mod:`~hub.snapshot.names`), files cut into content-addressed
blocks (:mod:`~hub.snapshot.blocks`), and manifest entries with their canonical form and
snapshot ids (:mod:`~hub.snapshot.manifest`). It imports only the hub's ground leaves
(:mod:`hub.errors`).
"""
