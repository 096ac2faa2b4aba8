"""Moving a data directory's embedded catalog into a shared one, and proving the copy.

``strata-hub migrate --data-dir D --catalog postgresql://…`` reads every record of
``D/catalog`` (LMDB) in one read transaction — a consistent snapshot, so publishes may go
on beside it; they will be missing from the copy, which :func:`compare` then reports —
and writes them into the shared catalog, which must be new, in one transaction
(:func:`hub.catalog.postgres.load_records`): a migration that fails leaves the target
empty. The recorded blob store is rewritten as an absolute location (a shared catalog's
replicas must all name the same store; a relative one meant "inside this data
directory"). Then both catalogs are read again and compared database by database: record
count and an xxh3-128 digest over the records in key order. Sequence numbers, manifest
numbers and version numbers are copied verbatim, so a spoke's Watch resumes across the
move. Once the copy is proven, the data directory's own catalog is marked as moved: every
command without ``--catalog`` on it is refused from then on (a ``gc`` there would delete
blocks the shared catalog still needs; a ``publish`` there would fork the history).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import xxhash

from hub.catalog import Catalog
from hub.catalog.postgres import PostgresEngine, load_records
from hub.catalog.schema import DB_NAMES, META_BLOBS, META_MIGRATED
from hub.errors import CatalogError
from hub.store.blobstore import open_blob_store
from hub.store.datadir import DataDir


@dataclass(frozen=True, slots=True)
class DatabaseDigest:
    """One named database's contents, summarized.

    Attributes:
        name: The database's name (``versions``, ``manifests``, …).
        records: How many records it holds.
        digest: xxh3-128 over its records in key order (length-prefixed keys and values).
    """

    name: str
    records: int
    digest: str


@dataclass(frozen=True, slots=True)
class MigrateResult:
    """What a migration copied.

    Attributes:
        records: Records written into the shared catalog.
        databases: The shared catalog's digests after the copy (equal to the source's).
        blobs: The blob store location recorded in the shared catalog.
    """

    records: int
    databases: tuple[DatabaseDigest, ...]
    blobs: str | None


def digests(catalog: Catalog, *, skip_blobs: bool = False) -> tuple[DatabaseDigest, ...]:
    """Every named database's record count and digest, from one read transaction.

    Args:
        catalog: The catalog to summarize.
        skip_blobs: Leave the ``meta`` records of the blob store location and of a past
            migration out (a migration rewrites the one and does not copy the other).
    """
    result = []
    with catalog.read() as txn:
        for name in DB_NAMES:
            hasher, count = xxhash.xxh3_128(), 0
            for key, value in txn.cursor(db=txn.db[name]):
                if skip_blobs and name == b"meta" and key in (META_BLOBS, META_MIGRATED):
                    continue
                for part in (key, value):
                    hasher.update(len(part).to_bytes(4, "big"))
                    hasher.update(part)
                count += 1
            result.append(DatabaseDigest(name.decode(), count, hasher.hexdigest()))
    return tuple(result)


def compare(source: Catalog, target: Catalog) -> list[str]:
    """The databases whose contents differ between two catalogs, as one line each.

    The blob store location is left out (a migration rewrites it).
    """
    lines = []
    for a, b in zip(
        digests(source, skip_blobs=True), digests(target, skip_blobs=True), strict=True
    ):
        if a != b:
            lines.append(
                f"{a.name}: {a.records} records ({a.digest[:12]}) in the source, "
                f"{b.records} ({b.digest[:12]}) in the copy"
            )
    return lines


def _records(catalog: Catalog, blobs: str | None) -> Iterator[tuple[int, bytes, bytes]]:
    with catalog.read() as txn:
        for index, name in enumerate(DB_NAMES):
            for key, value in txn.cursor(db=txn.db[name]):
                if name == b"meta" and key == META_MIGRATED:
                    continue
                if name == b"meta" and key == META_BLOBS:
                    if blobs is None:
                        continue
                    value = blobs.encode("utf-8")
                yield index, bytes(key), bytes(value)


def migrate(
    data_dir: str | os.PathLike[str], url: str, *, s3_endpoint: str | None = None
) -> MigrateResult:
    """Copies ``data_dir``'s catalog into the new shared catalog at ``url``, then compares.

    Args:
        data_dir: A hub data directory with its own catalog.
        url: A ``postgresql://`` URL of a database with no catalog yet (or an empty one).
        s3_endpoint: The S3 endpoint, to resolve an ``s3://`` blob store's location.

    Returns:
        What was copied.

    Raises:
        DataDirNotFound: ``data_dir`` is missing.
        ConfigError: ``url`` is not a ``postgresql://`` URL.
        CatalogError: The source has no catalog, the target is not empty, or the copy
            differs from the source (named database by database).
    """
    layout = DataDir.open(data_dir, create=False, catalog=url)
    with Catalog(layout.catalog_path, create=False) as source:
        recorded = source.blobs_location()
        blobs = None
        if recorded is not None:
            local = (
                recorded
                if "://" in recorded or os.path.isabs(recorded)
                else str(Path(layout.root) / recorded)
            )
            blobs = open_blob_store(local, endpoint_url=s3_endpoint).location
        engine = PostgresEngine(url, create=True)
        try:
            with engine.begin(write=False) as txn:
                known = txn.get(META_BLOBS, db=engine.dbs[b"meta"])
            if known is not None and known.decode("utf-8") != blobs:
                raise CatalogError(
                    f"catalog at {engine.location} already records blobs {known.decode()!r}, "
                    f"not this data directory's {blobs!r}"
                )
            written = load_records(engine, _records(source, blobs))
        finally:
            engine.close()
        with Catalog(url, create=False) as target:
            if target.blobs_location() != blobs:
                raise CatalogError(
                    f"the copy records blobs {target.blobs_location()!r}, not {blobs!r}"
                )
            different = compare(source, target)
            if different:
                raise CatalogError(
                    "the copy differs from the source (did a publish run meanwhile? migrate "
                    "into a new database again): " + "; ".join(different)
                )
            summary = digests(target)
        source.mark_migrated(target.location)
    return MigrateResult(written, summary, blobs)
