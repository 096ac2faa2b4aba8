"""The Strata hub: versioned, immutable dataset snapshots served over gRPC.

One module per responsibility: ``names`` (naming rules), ``errors`` (domain errors),
``blocks`` (splitting files into content-addressed blocks), ``manifest`` (entries and
snapshot ids), ``blobstore`` (block bytes: local directory, or S3-compatible in
``s3blobs``),
``catalog`` (datasets, versions, tags, manifests, block references and events in LMDB),
``events`` (the catalog's change log), ``datadir`` (on-disk layout), ``publish`` (tree
-> new version), ``gc`` (garbage collection), ``verify`` (immutability proofs), ``auth``
(bearer tokens), ``watch`` (noticing catalog changes), ``service`` (the gRPC servicer,
its handlers wrapped by ``calls``),
``gate`` (authentication before a request is read), ``inbound`` (receiving requests:
deadline and budget charge), ``budget`` and ``streams`` (what a token may make the hub
hold), ``bulk`` (the bulk block channel beside gRPC: block bytes by sendfile, the same
checks), ``server`` (running it: TLS, health, reflection, graceful stop),
``serverthread`` (the same on a thread, for synchronous callers), ``metrics``, ``address``
and ``cli`` (``strata-hub``). ``DESIGN.md`` beside this file states the invariants. The
hub never imports ``spoke``, ``fusemount`` or ``trainer``.
"""
