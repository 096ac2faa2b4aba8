"""``strata-hub`` commands on an existing catalog: tag, untag, revoke, gc, verify, migrate
and ls. :mod:`hub.cli.main` registers them, in that order, on its app; their errors go
through its error handling and audit log like every command's."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer

from hub.catalog import Catalog
from hub.catalog.locations import redact
from hub.cli.options import (
    BlobsOption,
    CatalogOption,
    DataDirOption,
    DatasetArgument,
    S3EndpointOption,
    say,
)
from hub.errors import CorruptBlob, CorruptCatalog
from hub.snapshot.manifest import EntryType
from hub.store.datadir import DataDir
from hub.store.gc import GRACE_SECONDS, STALE_AFTER_SECONDS, collect
from hub.store.migrate import migrate as migrate_catalog
from hub.store.verify import verify as verify_version

LS_PAGE = 1000
"""Directory entries ``ls DATASET REF PATH`` reads per catalog transaction."""

COMMANDS = ("tag", "untag", "revoke", "gc", "verify", "migrate", "ls")
"""The commands this module defines (function names), in the order ``--help`` lists them."""


def register(app: typer.Typer) -> None:
    """Adds :data:`COMMANDS` to ``app``."""
    for name in COMMANDS:
        app.command(name)(globals()[name])


def _catalog(data_dir: Path, catalog: str | None) -> Catalog:
    """Opens an existing data directory's catalog (or the shared one ``catalog`` names)."""
    return DataDir.open(data_dir, create=False, catalog=catalog).open_catalog(create=False)


def tag(
    data_dir: DataDirOption,
    dataset: DatasetArgument,
    version: Annotated[
        str,
        typer.Argument(metavar="VERSION", help="Version (or tag) to point at.", show_default=False),
    ],
    tag_name: Annotated[
        str, typer.Argument(metavar="TAG", help="Tag to create or move.", show_default=False)
    ],
    catalog: CatalogOption = None,
) -> None:
    """Point TAG at VERSION of DATASET, creating or moving it."""
    with _catalog(data_dir, catalog) as opened:
        result = opened.set_tag(dataset, tag_name, version)
    say(f"{dataset} {result.name} -> {result.version}")


def untag(
    data_dir: DataDirOption,
    dataset: DatasetArgument,
    tag_name: Annotated[
        str, typer.Argument(metavar="TAG", help="Tag to remove.", show_default=False)
    ],
    catalog: CatalogOption = None,
) -> None:
    """Remove TAG from DATASET."""
    with _catalog(data_dir, catalog) as opened:
        removed = opened.remove_tag(dataset, tag_name)
    say(f"{dataset}: removed tag {removed.name} (was {removed.version})")


def revoke(
    data_dir: DataDirOption,
    dataset: DatasetArgument,
    version: Annotated[
        str,
        typer.Argument(metavar="VERSION", help="Version to revoke, e.g. v2.", show_default=False),
    ],
    catalog: CatalogOption = None,
) -> None:
    """Revoke VERSION of DATASET: it no longer resolves and its blocks are no longer served.

    Tags pointing at it are removed. Blocks no live version shares become garbage for
    `strata-hub gc`. The version number is never reused.
    """
    with _catalog(data_dir, catalog) as opened:
        result = opened.revoke(dataset, version)
    removed = ", ".join(result.removed_tags) or "none"
    say(f"revoked {dataset} {version} (tags removed: {removed})")


def gc(
    data_dir: DataDirOption,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only report what would be deleted.")
    ] = False,
    keep_events: Annotated[
        int | None,
        typer.Option("--keep-events", help="Prune all but this many newest catalog events."),
    ] = None,
    stale_after: Annotated[
        float,
        typer.Option(
            "--stale-after", help="Seconds after which a publish in progress counts as abandoned."
        ),
    ] = STALE_AFTER_SECONDS,
    grace: Annotated[
        float,
        typer.Option(
            "--grace",
            help="Seconds a blob must have been found unreferenced before it is deleted "
            "(default a week: a catalog backup that old restores without a lost block; "
            "0: at once).",
            min=0,
        ),
    ] = GRACE_SECONDS,
    blobs: BlobsOption = None,
    s3_endpoint: S3EndpointOption = None,
    catalog: CatalogOption = None,
) -> None:
    """Delete blobs no live version references (safe while publishes and serve run), once
    they have been unreferenced for --grace seconds."""
    layout = DataDir.open(data_dir, create=False, catalog=catalog)
    with layout.open_catalog(create=False) as opened:
        store = layout.blob_store(opened, blobs, endpoint_url=s3_endpoint)
        result = collect(
            opened,
            store,
            dry_run=dry_run,
            keep_events=keep_events,
            stale_after_s=stale_after,
            grace_s=grace,
        )
    verb = "would delete" if dry_run else "deleted"
    say(
        f"gc: scanned {result.blobs_scanned} blobs, {verb} {result.blobs_deleted}, "
        f"{result.blobs_waiting} unreferenced within the {grace:g} s grace; "
        f"abandoned publishes {result.publishes_dropped}, temp files {result.temp_removed}, "
        f"events pruned {result.events_pruned}"
    )


def verify(
    data_dir: DataDirOption,
    dataset: DatasetArgument,
    ref: Annotated[
        str, typer.Argument(metavar="REF", help="Version or tag to verify.", show_default=False)
    ],
    blocks: Annotated[
        bool, typer.Option("--blocks", help="Also read and re-hash every block.")
    ] = False,
    blobs: BlobsOption = None,
    s3_endpoint: S3EndpointOption = None,
    catalog: CatalogOption = None,
) -> None:
    """Prove a version is unchanged: re-hash its manifest (and blocks) against its ids.

    Exits 0 when intact, 1 on any mismatch.
    """
    layout = DataDir.open(data_dir, create=False, catalog=catalog)
    with layout.open_catalog(create=False) as opened:
        store = layout.blob_store(opened, blobs, endpoint_url=s3_endpoint)
        result = verify_version(opened, store, dataset, ref, blocks=blocks)
    snapshot = result.snapshot
    if result.manifest_digest != snapshot.snapshot_id:
        raise CorruptCatalog(
            f"{dataset} {snapshot.version}: manifest hashes to {result.manifest_digest}, "
            f"not its snapshot id {snapshot.snapshot_id}"
        )
    if result.missing or result.corrupt:
        raise CorruptBlob(
            f"{dataset} {snapshot.version}: {len(result.missing)} missing and "
            f"{len(result.corrupt)} corrupt blocks, e.g. {(result.missing + result.corrupt)[0]}"
        )
    checked = f", {result.blocks_checked} blocks" if blocks else ""
    print(f"{dataset} {snapshot.version} {snapshot.snapshot_id} ok{checked}", flush=True)


def migrate(
    data_dir: DataDirOption,
    catalog: Annotated[
        str,
        typer.Option(
            "--catalog",
            envvar="STRATA_HUB_CATALOG",
            help="The new shared catalog, postgresql://USER@HOST:PORT/DB (an empty database).",
            show_default=False,
        ),
    ],
    s3_endpoint: S3EndpointOption = None,
) -> None:
    """Copy DATA_DIR's own catalog into a new shared catalog, then prove the copy equal.

    Stop publishing while it runs (a publish during the copy makes the check fail; run it
    again into a new database). Afterwards serve, publish, tag and gc with --catalog.
    """
    result = migrate_catalog(data_dir, catalog, s3_endpoint=s3_endpoint)
    for database in result.databases:
        print(f"{database.name:<12} {database.records:>10} records  {database.digest}")
    say(
        f"migrated {result.records} records into {redact(catalog)}; both catalogs hold the "
        f"same records (blobs: {result.blobs or 'none recorded'})"
    )


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns separated by two spaces."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in [header, *rows]
    ]
    return "\n".join(line.rstrip() for line in lines)


def _timestamp(ns: int) -> str:
    """Nanoseconds since the Unix epoch as ISO 8601 UTC, to the second."""
    moment = datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _directory_rows(catalog: Catalog, dataset: str, ref: str, path: str) -> list[tuple[str, ...]]:
    """``(type, size, name)`` of each child of ``path`` in ``dataset@ref``, in name order.

    Raises:
        HubError: The dataset, ref or directory does not exist, or ``path`` is a file.
    """
    snapshot = catalog.resolve(dataset, ref)
    rows: list[tuple[str, ...]] = []
    after, more = "", True
    while more:
        page, more = catalog.list_directory(snapshot.snapshot_id, path, after, LS_PAGE)
        for entry in page:
            name = entry.path.rpartition("/")[2]
            size = str(entry.size) if entry.type == EntryType.FILE else "-"
            rows.append((entry.type.name.lower(), size, name))
        after = page[-1].path.rpartition("/")[2] if page else after
    return rows


def ls(
    data_dir: DataDirOption,
    dataset: Annotated[
        str | None,
        typer.Argument(metavar="DATASET", help="List this dataset's versions and tags."),
    ] = None,
    ref: Annotated[
        str | None,
        typer.Argument(metavar="REF", help="List a directory of this version or tag."),
    ] = None,
    path: Annotated[
        str,
        typer.Argument(metavar="PATH", help="The directory, relative to the snapshot root."),
    ] = "",
    show_all: Annotated[
        bool, typer.Option("--all", help="Also list revoked versions, with a STATE column.")
    ] = False,
    catalog: CatalogOption = None,
) -> None:
    """List datasets, one dataset's versions with their tags, or a directory of a version.

    A directory is listed through the catalog's directory index, a page at a time, without
    reading the rest of the manifest (a million-file snapshot lists one directory fast).
    """
    layout = DataDir.open(data_dir, create=False, catalog=catalog)
    with layout.open_catalog(create=False) as opened:
        if dataset is not None and ref is not None:
            print(_table(("TYPE", "SIZE", "NAME"), _directory_rows(opened, dataset, ref, path)))
            return
        if dataset is None:
            datasets = opened.list_datasets()
            print(
                _table(
                    ("DATASET", "VERSIONS", "LATEST"),
                    [(d.name, str(d.version_count), d.latest_version) for d in datasets],
                )
            )
            return
        versions = opened.list_versions(dataset, include_revoked=show_all)
        tags: dict[str, list[str]] = {}
        for tag in opened.list_tags(dataset):
            tags.setdefault(tag.version, []).append(tag.name)
    header: tuple[str, ...] = ("VERSION", "CREATED", "FILES", "BYTES", "SNAPSHOT", "TAGS")
    rows: list[tuple[str, ...]] = [
        (
            s.version,
            _timestamp(s.created_ns),
            str(s.file_count),
            str(s.total_bytes),
            s.snapshot_id,
            ",".join(tags.get(s.version, [])),
        )
        for s in versions
    ]
    if show_all:
        header = (*header, "STATE")
        rows = [
            (*row, "revoked" if s.revoked else "live")
            for row, s in zip(rows, versions, strict=True)
        ]
    print(_table(header, rows))
