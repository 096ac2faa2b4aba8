"""The Strata hub: versioned, immutable dataset snapshots served over gRPC.

One module per responsibility: ``names`` (naming rules), ``errors`` (domain errors),
``blocks`` (splitting files into content-addressed blocks), ``manifest`` (entries and
snapshot ids), ``blobstore`` (block bytes), ``catalog`` (datasets, versions, tags,
manifests in LMDB), ``datadir`` (on-disk layout), ``publish`` (tree -> new version),
``service`` (the gRPC servicer), ``server`` (running it), ``metrics``, ``address`` and
``cli`` (``strata-hub``). The hub never imports ``spoke``, ``fusemount`` or ``trainer``.
"""
