"""The catalog's records on disk: database names, record layouts and key builders.

The table of records is in :mod:`hub.catalog`'s docstring; this module is its code.
Integers are big-endian, names UTF-8, digests raw 16 bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import lmdb
import xxhash

from hub.errors import CorruptCatalog

MANIFEST_PAGE_ENTRIES = 512
"""Manifest entries read per read transaction by :meth:`Catalog.iter_manifest`."""

STAGE_ENTRIES = 1024
"""Manifest entries a publish buffers before writing them in one staging transaction."""

DATASET = struct.Struct(">Iq")
"""``datasets`` value: last_version u32 | created_ns i64."""
U32 = struct.Struct(">I")
U64 = struct.Struct(">Q")
I64 = struct.Struct(">q")
VERSION = struct.Struct(">16sq")
"""``versions`` value: snapshot_id | created_ns i64."""
SNAPSHOT = struct.Struct(">IQQQQI")
"""``snapshots`` value: block_size | file_count | total_bytes | entry_count | manifest |
live_versions."""
BLOCK = struct.Struct(">QI")
"""``blocks`` value: live references u64 | size u32."""
PUBLISH = struct.Struct(">qI")
"""``publishes`` value: started_ns i64 | pid u32, then the host name."""

DB_NAMES = (
    b"meta",
    b"datasets",
    b"versions",
    b"revoked",
    b"tags",
    b"snapshots",
    b"manifests",
    b"dirs",
    b"blocks",
    b"block_refs",
    b"pending",
    b"publishes",
    b"events",
    b"signatures",
)
"""The named LMDB databases of a catalog."""

META_FORMAT = b"format"
META_SEQUENCE = b"last_sequence"
META_MANIFEST = b"next_manifest"
META_BLOBS = b"blobs"
META_BLOCK_BYTES = b"block_bytes"
META_LIVE_SNAPSHOTS = b"live_snapshots"
META_MIGRATED = b"migrated_to"
"""Set by ``strata-hub migrate`` on the catalog it copied: the shared catalog it moved to."""
META_GRANT_KEY = b"grant_key_id"
"""The key id (``protocol.grants.key_id``, public) of the key every replica of a shared
catalog signs read grants with; recorded by the first ``serve``."""


def dataset_prefix(dataset: str) -> bytes:
    """``dataset NUL``: the prefix of a dataset's ``versions``, ``revoked`` and ``tags`` keys."""
    return dataset.encode("utf-8") + b"\0"


def version_key(dataset: str, number: int) -> bytes:
    """``dataset NUL version u32``."""
    return dataset_prefix(dataset) + U32.pack(number)


def dir_hash(directory: str) -> bytes:
    """The 16-byte key part naming a directory (its path's xxh3-128; ``""`` is the root)."""
    return xxhash.xxh3_128_digest(directory.encode("utf-8"))


def split_path(path: str) -> tuple[str, str]:
    """``"a/b/c"`` -> ``("a/b", "c")``; ``"c"`` -> ``("", "c")``."""
    parent, _, name = path.rpartition("/")
    return parent, name


def dir_key(manifest: int, path: str) -> bytes:
    """``dirs`` key of ``path``: ``manifest u64 | xxh3-128(parent) | name``."""
    parent, name = split_path(path)
    return U64.pack(manifest) + dir_hash(parent) + name.encode("utf-8")


def iter_prefix(cursor: lmdb.Cursor[bytes], prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
    """Yields the (key, value) pairs whose key starts with ``prefix``, in key order."""
    if not cursor.set_range(prefix):
        return
    for key, value in cursor:
        if not key.startswith(prefix):
            return
        yield key, value


def delete_prefix(cursor: lmdb.Cursor[bytes], prefix: bytes) -> int:
    """Deletes every key that starts with ``prefix``; returns how many (in one statement
    on a cursor that can, :meth:`hub.catalog.pgtxn.PgCursor.delete_prefix`)."""
    bulk = getattr(cursor, "delete_prefix", None)
    if bulk is not None:
        return int(bulk(prefix))
    deleted = 0
    if not cursor.set_range(prefix):
        return 0
    while cursor.key().startswith(prefix):
        if not cursor.delete():
            break
        deleted += 1
    return deleted


def add_count(txn: lmdb.Transaction[bytes], db: lmdb._Database, key: bytes, delta: int) -> int:
    """Adds ``delta`` to a u64 counter record (deleting it at 0); returns the new count.

    Raises:
        CorruptCatalog: The count would drop below zero.
    """
    value = txn.get(key, db=db)
    count = (U64.unpack(value[:8])[0] if value is not None else 0) + delta
    if count < 0:
        raise CorruptCatalog(f"reference count of {key.hex()} would drop below zero")
    if count == 0:
        txn.delete(key, db=db)
    else:
        txn.put(key, U64.pack(count) + (value[8:] if value is not None else b""), db=db)
    return count
