"""The Strata hub: versioned, immutable dataset snapshots served over gRPC.

Rooms, top floor first; a room imports only the rooms below it (the ``layers`` contract
in ``pyproject.toml``), and each room's ``__init__`` says what it owns:

- :mod:`hub.cli` — ``strata-hub``;
- :mod:`hub.serve` (the gRPC server, its door, the bulk channel, metrics) beside
  :mod:`hub.publish` (a directory tree -> a new version); neither imports the other;
- :mod:`hub.store` — blob stores, the data directory, gc, verify, migrate;
- :mod:`hub.catalog` — datasets, versions, tags, manifests, block references and the
  change log's events, in LMDB or PostgreSQL;
- :mod:`hub.auth` (tokens, grants, signatures) beside :mod:`hub.limits` (what a caller
  may make the hub hold);
- :mod:`hub.snapshot` — names, blocks, manifests;
- the ground leaves, which import nothing of the hub: :mod:`hub.errors` (domain errors),
  :mod:`hub.modes` (private file modes) and :mod:`hub.audit` (the audit trail); what the
  hub shares with the spoke on its machine is in :mod:`strata_local` (write-then-rename,
  private directories, malloc arenas).

``DESIGN.md`` beside this file states the invariants. The hub never imports ``spoke``,
``fusemount`` or ``trainer``.
"""
