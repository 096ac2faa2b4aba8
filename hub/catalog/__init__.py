"""The catalog: datasets, versions, tags, snapshots, manifests and events in LMDB.

Records (named LMDB databases; integers big-endian, names UTF-8, digests raw 16 bytes):

==========  ==========================================  =====================================
database    key                                         value
==========  ==========================================  =====================================
meta        ``format`` / ``last_sequence`` /            u32 / u64 / u64 / blob store URL
            ``next_manifest`` / ``blobs``
datasets    dataset                                     last_version u32 | created_ns i64
versions    dataset NUL version u32                     snapshot_id | created_ns i64
revoked     dataset NUL version u32                     revoked_ns i64
tags        dataset NUL tag                             version u32
snapshots   snapshot_id                                 block_size u32 | file_count u64
                                                        | total_bytes u64 | entry_count u64
                                                        | manifest u64 | live_versions u32
manifests   manifest u64 | index u64                    canonical entry (hub.snapshot.manifest)
dirs        manifest u64 | xxh3-128(parent) | name      index u64
blocks      digest                                      live references u64 | size u32
block_refs  digest | dataset                            live references u64
pending     digest | publish u64                        (empty)
publishes   publish u64                                 started_ns i64 | pid u32 | host
events      sequence u64                                event record (hub.catalog.events)
signatures  dataset NUL version u32                     Ed25519 signature (hub.auth.signing)
==========  ==========================================  =====================================

**Immutability.** A version record is written once (``put(overwrite=False)``) and never
changed; its snapshot id is the xxh3-128 digest of the canonical manifest, so
:meth:`Catalog.manifest_digest` can prove at any time that the stored manifest is the one
published. Revoking a version adds a ``revoked`` record; it never edits the version.
Tags are the only records that move. Version numbers are never reused.

**Manifests** are keyed by a manifest number and their index in path order (LMDB keys are
at most 511 bytes, a path may be 4095). The ``dirs`` index maps (parent directory, name)
to the entry's index, so one directory is listed by a range scan over its children
without reading the rest of the manifest. Snapshots with equal ids share one manifest.

**Publishing** (:class:`PublishSession`) is staged: entries are written in small
transactions under a fresh manifest number no snapshot points at yet, so a publish of a
million files never holds its manifest in memory nor the writer lock for long. The
final :meth:`PublishSession.commit` is one write transaction that creates the version,
its snapshot (or shares an identical one and drops the staged copy), the tag, the block
references and the events. Before a publish stores a block it *protects* the digest
(``pending``), so garbage collection never deletes a block that a publish in flight is
about to rely on; commit turns protections into references.

**Block references.** ``blocks`` counts, per digest, its occurrences in the manifests of
live (unrevoked) versions; ``block_refs`` splits the count by dataset. A digest absent
from ``blocks`` and from ``pending`` is garbage. ``block_refs`` answers "may a caller who
reads these datasets read this block?" with one range lookup.

**Events** are appended in the same transaction as the change they report, under
``last_sequence + 1`` (:mod:`hub.catalog.events`).

**Concurrency.** All writes happen in LMDB write transactions (one writer at a time,
across processes); every read opens a fresh read transaction and so sees the latest
commit, including those of other processes. LMDB forbids opening one environment twice
in a process, so :class:`Catalog` objects on one directory share an environment
(reference counted). Source: LMDB's documentation, http://www.lmdb.tech/doc/.

**Modules.** :mod:`~hub.catalog.schema` (database names, record layouts, key builders),
:mod:`~hub.catalog.env` (the shared environment, the format stamp),
:mod:`~hub.catalog.records` (what the catalog returns), :mod:`~hub.catalog.txn` (one
transaction and the record operations inside it), :mod:`~hub.catalog.base` (opening
transactions), :mod:`~hub.catalog.manifests`, :mod:`~hub.catalog.refs`,
:mod:`~hub.catalog.eventlog` (the methods of each concern), :mod:`~hub.catalog.publish`
(:class:`PublishSession`) and :mod:`~hub.catalog.catalog` (:class:`Catalog`: datasets,
versions, tags, revocation).
"""

from hub.catalog.catalog import Catalog
from hub.catalog.env import CATALOG_FORMAT, DEFAULT_MAP_SIZE
from hub.catalog.publish import PublishSession
from hub.catalog.records import (
    CatalogStats,
    Dataset,
    PublishRecord,
    Revocation,
    Snapshot,
    Tag,
)
from hub.catalog.schema import MANIFEST_PAGE_ENTRIES, STAGE_ENTRIES
from hub.catalog.txn import CatalogTxn

__all__ = [
    "CATALOG_FORMAT",
    "DEFAULT_MAP_SIZE",
    "MANIFEST_PAGE_ENTRIES",
    "STAGE_ENTRIES",
    "Catalog",
    "CatalogStats",
    "CatalogTxn",
    "Dataset",
    "PublishRecord",
    "PublishSession",
    "Revocation",
    "Snapshot",
    "Tag",
]
