"""``strata-hub``: serve, publish, tag, revoke, collect garbage, verify and list datasets.

```
strata-hub serve   --data-dir DIR --listen HOST:PORT [--metrics HOST:PORT] [--port-file PATH]
                   [--tls-cert PEM --tls-key PEM [--client-ca PEM]] [--tokens FILE [--insecure]]
                   [--max-message-bytes N] [--max-connections N] [--handshake-timeout S]
                   [--max-streams-per-token N] [--max-bytes-per-token N]
                   [--max-bytes-in-flight N] [--budget-wait S] [--grant-holders-per-token N]
                   [--max-manifest-streams N] [--max-watch-streams N]
                   [--grace SECONDS] [--blobs DIR|s3://B/P]
                   [--grant-key PEM] [--grant-lifetime SECONDS]
                   [--audit-log FILE] [--audit-max-bytes N] [--audit-backups N]
strata-hub publish --data-dir DIR DATASET SRC_DIR [--tag latest] [--block-size BYTES]
                   [--version vN] [--blobs DIR|s3://B/P] [--signing-key PEM]
                   [--allow-external-symlinks]
strata-hub keygen  PRIVATE PUBLIC
strata-hub tag     --data-dir DIR DATASET VERSION TAG
strata-hub untag   --data-dir DIR DATASET TAG
strata-hub revoke  --data-dir DIR DATASET VERSION
strata-hub gc      --data-dir DIR [--dry-run] [--keep-events N] [--stale-after SECONDS]
strata-hub verify  --data-dir DIR DATASET REF [--blocks]
strata-hub ls      --data-dir DIR [DATASET [REF [PATH]]] [--all]
strata-hub token   create|list|revoke|migrate --tokens FILE ...   (see hub/tokencli.py)
```

Every command runs under umask 077 and keeps the data directory owner-only
(:mod:`hub.datadir`).

Output contract: ``serve`` prints exactly one line, ``strata-hub: serving DIR on HOST:PORT``
(the bound port), to stdout once it accepts calls, and exits 0 on SIGINT or SIGTERM after
a grace period. ``publish`` prints the new version (e.g. ``v3``) on stdout and a summary
on stderr. Every error is one line on stderr, ``strata-hub: error: ...``, with exit code 2
for bad input (usage, names, paths, addresses, refused changes) and 1 for system failures
(I/O errors, an unreachable or corrupt store; a failed ``verify``).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer

from hub.atomic import write_atomic
from hub.audit import DEFAULT_BACKUPS, DEFAULT_MAX_BYTES, AuditLog, operator
from hub.blocks import DEFAULT_BLOCK_SIZE
from hub.budget import BYTES_PER_TOKEN, STREAMS_PER_TOKEN, TOTAL_BYTES, WAIT_S
from hub.catalog import Catalog
from hub.catalog.locations import redact
from hub.datadir import DataDir, secure
from hub.errors import CatalogUnavailable, CorruptBlob, CorruptCatalog, HubError, StorageError
from hub.gc import STALE_AFTER_SECONDS, collect
from hub.grants import DEFAULT_LIFETIME_S, HOLDERS_PER_TOKEN
from hub.limits import HANDSHAKE_TIMEOUT_S, MAX_CONNECTIONS
from hub.manifest import EntryType
from hub.metrics import HubMetrics, MetricsEndpoint
from hub.migrate import migrate as migrate_catalog
from hub.modes import PRIVATE_UMASK
from hub.publish import publish as publish_tree
from hub.server import GRACE_SECONDS, MAX_MESSAGE_BYTES, HubServer, ServerConfig
from hub.signing import keygen as keygen_pair
from hub.streams import MANIFEST_STREAMS, WATCH_STREAMS
from hub.tokencli import token_app
from hub.verify import verify as verify_version
from strata_local.memory import limit_malloc_arenas

PROG = "strata-hub"
EXIT_USAGE = 2
EXIT_FAILURE = 1
LS_PAGE = 1000
"""Directory entries ``ls DATASET REF PATH`` reads per catalog transaction."""

app = typer.Typer(
    name=PROG,
    help="Strata hub: versioned, immutable dataset snapshots served over gRPC.",
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(token_app)

DataDirOption = Annotated[
    Path,
    typer.Option(
        "--data-dir",
        envvar="STRATA_HUB_DATA_DIR",
        help="Hub data directory (catalog/ and blobs/).",
        show_default=False,
    ),
]


CatalogOption = Annotated[
    str | None,
    typer.Option(
        "--catalog",
        envvar="STRATA_HUB_CATALOG",
        help="A shared catalog, postgresql://USER@HOST:PORT/DB (libpq's URI; the password "
        "best in $PGPASSFILE), that several hub replicas serve (default: DATA_DIR/catalog, "
        "this machine's own). The first command on a new one must name --blobs.",
        show_default=False,
    ),
]

BlobsOption = Annotated[
    str | None,
    typer.Option(
        "--blobs",
        envvar="STRATA_HUB_BLOBS",
        help="Blob store: a directory or s3://BUCKET/PREFIX (default: the one the catalog "
        "records, else DATA_DIR/blobs).",
        show_default=False,
    ),
]

S3EndpointOption = Annotated[
    str | None,
    typer.Option(
        "--s3-endpoint",
        envvar="STRATA_HUB_S3_ENDPOINT",
        help="S3 endpoint URL for s3:// blob stores (default: AWS, or $AWS_ENDPOINT_URL).",
        show_default=False,
    ),
]

DatasetArgument = Annotated[
    str, typer.Argument(metavar="DATASET", help="Dataset name, e.g. f3.", show_default=False)
]


def _say(message: str) -> None:
    """Writes one line to stderr, prefixed with the program name."""
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def _write_port_file(path: Path, port: int) -> None:
    """Writes ``port`` and a newline to ``path`` atomically (temp file, then rename)."""
    write_atomic(path, f"{port}\n".encode())


async def _serve(
    data_dir: Path,
    listen: str,
    metrics_listen: str | None,
    port_file: Path | None,
    config: ServerConfig,
    grace: float,
) -> None:
    """Runs the server until SIGINT or SIGTERM; start-up and shutdown in reverse order."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    async with contextlib.AsyncExitStack() as stack:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
            stack.callback(loop.remove_signal_handler, signum)
        metrics = HubMetrics()
        if metrics_listen is not None:
            endpoint = MetricsEndpoint.start(metrics_listen, metrics)
            stack.callback(endpoint.close)
        server = await HubServer.start(data_dir, listen, metrics=metrics, config=config)
        stack.push_async_callback(server.stop, grace)
        if port_file is not None:
            try:
                _write_port_file(port_file, server.port)
            except OSError as exc:
                raise HubError(f"cannot write port file {port_file}: {exc.strerror}") from exc
        print(f"{PROG}: serving {data_dir} on {server.address}", flush=True)
        if metrics_listen is not None:
            _say(f"metrics on http://{endpoint.address}/metrics")
        if config.catalog is not None:
            _say(f"shared catalog {redact(config.catalog)}")
        await stop.wait()


@app.command()
def serve(
    data_dir: DataDirOption,
    listen: Annotated[
        str, typer.Option("--listen", help="gRPC address HOST:PORT; port 0 picks a free port.")
    ],
    metrics: Annotated[
        str | None,
        typer.Option("--metrics", help="Serve Prometheus metrics on HOST:PORT."),
    ] = None,
    port_file: Annotated[
        Path | None,
        typer.Option("--port-file", help="Write the bound gRPC port to this file."),
    ] = None,
    tls_cert: Annotated[
        Path | None,
        typer.Option("--tls-cert", help="Serve TLS with this PEM certificate chain."),
    ] = None,
    tls_key: Annotated[
        Path | None, typer.Option("--tls-key", help="PEM private key of --tls-cert.")
    ] = None,
    client_ca: Annotated[
        Path | None,
        typer.Option(
            "--client-ca", help="Require client certificates signed by this PEM CA (mTLS)."
        ),
    ] = None,
    tokens: Annotated[
        Path | None,
        typer.Option(
            "--tokens",
            help="Require bearer tokens: a YAML/TOML/JSON file mapping token -> dataset "
            'globs (or "*").',
        ),
    ] = None,
    insecure: Annotated[
        bool,
        typer.Option(
            "--insecure",
            help="Allow --tokens and read grants without TLS (they travel in cleartext).",
        ),
    ] = False,
    max_message_bytes: Annotated[
        int,
        typer.Option("--max-message-bytes", help="Largest gRPC message sent or received."),
    ] = MAX_MESSAGE_BYTES,
    max_connections: Annotated[
        int,
        typer.Option(
            "--max-connections",
            help="Most client connections open at once; more are closed as they arrive "
            "(about 45 KiB each while a TLS handshake is pending).",
        ),
    ] = MAX_CONNECTIONS,
    handshake_timeout: Annotated[
        float,
        typer.Option(
            "--handshake-timeout",
            help="Seconds a connection may take to finish its TLS handshake and send its "
            "HTTP/2 settings before it is closed.",
        ),
    ] = HANDSHAKE_TIMEOUT_S,
    max_streams_per_token: Annotated[
        int,
        typer.Option(
            "--max-streams-per-token",
            help="Most ReadBlocks streams one token may have open; more are refused "
            "(RESOURCE_EXHAUSTED). A spoke opens up to 16.",
        ),
    ] = STREAMS_PER_TOKEN,
    max_bytes_per_token: Annotated[
        int,
        typer.Option(
            "--max-bytes-per-token",
            help="Most block bytes the hub holds for one token's ReadBlocks streams "
            "(unread by the client); a stream waits for room, up to --budget-wait.",
        ),
    ] = BYTES_PER_TOKEN,
    max_bytes_in_flight: Annotated[
        int,
        typer.Option(
            "--max-bytes-in-flight",
            help="Most block bytes the hub holds for every ReadBlocks stream together.",
        ),
    ] = TOTAL_BYTES,
    budget_wait: Annotated[
        float,
        typer.Option(
            "--budget-wait",
            help="Seconds a ReadBlocks stream waits for room in the byte budget before it "
            "is refused (RESOURCE_EXHAUSTED).",
        ),
    ] = WAIT_S,
    max_manifest_streams: Annotated[
        int,
        typer.Option(
            "--max-manifest-streams",
            help="Most GetManifest streams open at once, one token at most an eighth; a "
            "stream waits for a slot up to --budget-wait, then is refused.",
        ),
    ] = MANIFEST_STREAMS,
    max_watch_streams: Annotated[
        int,
        typer.Option(
            "--max-watch-streams",
            help="Most Watch streams open at once (a spoke holds one), one token at most "
            "an eighth; more are refused (RESOURCE_EXHAUSTED).",
        ),
    ] = WATCH_STREAMS,
    grant_holders_per_token: Annotated[
        int,
        typer.Option(
            "--grant-holders-per-token",
            help="Most holder keys (spokes) one token may hold live read grants for; a "
            "region whose nodes share one token needs about twice its node count.",
        ),
    ] = HOLDERS_PER_TOKEN,
    grace: Annotated[
        float,
        typer.Option("--grace", help="Seconds calls in flight get to finish on shutdown."),
    ] = GRACE_SECONDS,
    blobs: BlobsOption = None,
    s3_endpoint: S3EndpointOption = None,
    grant_key: Annotated[
        Path | None,
        typer.Option(
            "--grant-key",
            help="Ed25519 key (PEM, strata-hub keygen) that signs the spokes' read grants "
            "for the regional mesh (default: DATA_DIR/grant.key, made at first start).",
        ),
    ] = None,
    grant_lifetime: Annotated[
        float,
        typer.Option(
            "--grant-lifetime",
            help="Seconds a read grant is valid (1 to 300): how long a narrowed or revoked "
            "token may still be used at the spokes' peers.",
        ),
    ] = DEFAULT_LIFETIME_S,
    audit_log: Annotated[
        Path | None,
        typer.Option(
            "--audit-log",
            help="JSON-lines audit file (default DATA_DIR/audit.jsonl, or "
            "$STRATA_HUB_AUDIT_LOG); rotated files FILE.1 ... go beside it.",
        ),
    ] = None,
    audit_max_bytes: Annotated[
        int,
        typer.Option("--audit-max-bytes", help="Rotate the audit file before it passes this."),
    ] = DEFAULT_MAX_BYTES,
    audit_backups: Annotated[
        int, typer.Option("--audit-backups", help="Rotated audit files kept.")
    ] = DEFAULT_BACKUPS,
    catalog: CatalogOption = None,
) -> None:
    """Serve the data directory's datasets over gRPC until SIGINT or SIGTERM.

    Also serves gRPC health checking and server reflection. Catalog changes made by
    other processes (publish, tag, revoke) reach Watch streams within a second.
    """
    config = ServerConfig(
        tls_cert=tls_cert,
        tls_key=tls_key,
        client_ca=client_ca,
        tokens=tokens,
        insecure=insecure,
        max_message_bytes=max_message_bytes,
        blobs=blobs,
        s3_endpoint=s3_endpoint,
        catalog=catalog,
        grant_key=grant_key,
        grant_lifetime_s=grant_lifetime,
        audit_log=audit_log,
        audit_max_bytes=audit_max_bytes,
        audit_backups=audit_backups,
        max_connections=max_connections,
        handshake_timeout_s=handshake_timeout,
        max_streams_per_token=max_streams_per_token,
        max_bytes_per_token=max_bytes_per_token,
        max_bytes_in_flight=max_bytes_in_flight,
        budget_wait_s=budget_wait,
        grant_holders_per_token=grant_holders_per_token,
        max_manifest_streams=max_manifest_streams,
        max_watch_streams=max_watch_streams,
    )
    limit_malloc_arenas()  # before gRPC starts its threads (strata_local/memory.py)
    asyncio.run(_serve(data_dir, listen, metrics, port_file, config, grace))


@app.command()
def publish(
    data_dir: DataDirOption,
    dataset: Annotated[
        str, typer.Argument(metavar="DATASET", help="Dataset name, e.g. f3.", show_default=False)
    ],
    src_dir: Annotated[
        Path,
        typer.Argument(metavar="SRC_DIR", help="Directory tree to publish.", show_default=False),
    ],
    tag: Annotated[str, typer.Option("--tag", help="Tag to point at the new version.")] = "latest",
    block_size: Annotated[
        int, typer.Option("--block-size", help="Maximum block length, bytes.")
    ] = DEFAULT_BLOCK_SIZE,
    version: Annotated[
        str | None,
        typer.Option(
            "--version",
            help="Publish as exactly this version (the next one); refused if it exists.",
        ),
    ] = None,
    blobs: BlobsOption = None,
    s3_endpoint: S3EndpointOption = None,
    signing_key: Annotated[
        Path | None,
        typer.Option(
            "--signing-key",
            help="Sign the new version with this Ed25519 key (strata-hub keygen).",
        ),
    ] = None,
    allow_external_symlinks: Annotated[
        bool,
        typer.Option(
            "--allow-external-symlinks",
            help="Publish symlinks whose target leaves SRC_DIR (absolute, or '..' above "
            "it); refused by default.",
        ),
    ] = False,
    catalog: CatalogOption = None,
) -> None:
    """Publish SRC_DIR as the next version of DATASET; prints the new version.

    Only blocks not stored yet are written; the summary on stderr says how many. The
    tree is read through directory descriptors, never re-resolving a path: a directory
    replaced (e.g. by a symlink) while publishing stops the publish and nothing is
    stored under the new version.
    """
    result = publish_tree(
        data_dir,
        dataset,
        src_dir,
        tag=tag,
        block_size=block_size,
        version=version,
        blobs=blobs,
        s3_endpoint=s3_endpoint,
        signing_key=signing_key,
        allow_external_symlinks=allow_external_symlinks,
        catalog=catalog,
    )
    print(result.version, flush=True)
    _say(
        f"published {result.dataset} {result.version} (tag {tag}): {result.files} files, "
        f"{result.bytes} bytes, {result.new_blocks} new blocks, {result.new_bytes} new bytes, "
        f"snapshot {result.snapshot_id}"
    )


@app.command()
def keygen(
    private: Annotated[
        Path, typer.Argument(metavar="PRIVATE", help="Private key to write (0600).")
    ],
    public: Annotated[
        Path, typer.Argument(metavar="PUBLIC", help="Public key to write (for spokes).")
    ],
) -> None:
    """Write a new Ed25519 key pair for signed publishes (publish --signing-key PRIVATE;
    spokes check with --publisher-key PUBLIC) or read grants (serve --grant-key PRIVATE;
    spokes may pin --peer-grant-key PUBLIC)."""
    keygen_pair(private, public)
    _say(f"wrote signing key {private} and public key {public}")


def _catalog(data_dir: Path, catalog: str | None) -> Catalog:
    """Opens an existing data directory's catalog (or the shared one ``catalog`` names)."""
    return DataDir.open(data_dir, create=False, catalog=catalog).open_catalog(create=False)


@app.command()
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
    _say(f"{dataset} {result.name} -> {result.version}")


@app.command()
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
    _say(f"{dataset}: removed tag {removed.name} (was {removed.version})")


@app.command()
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
    _say(f"revoked {dataset} {version} (tags removed: {removed})")


@app.command()
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
    blobs: BlobsOption = None,
    s3_endpoint: S3EndpointOption = None,
    catalog: CatalogOption = None,
) -> None:
    """Delete blobs no live version references (safe while publishes and serve run)."""
    layout = DataDir.open(data_dir, create=False, catalog=catalog)
    with layout.open_catalog(create=False) as opened:
        store = layout.blob_store(opened, blobs, endpoint_url=s3_endpoint)
        result = collect(
            opened, store, dry_run=dry_run, keep_events=keep_events, stale_after_s=stale_after
        )
    verb = "would delete" if dry_run else "deleted"
    _say(
        f"gc: scanned {result.blobs_scanned} blobs, {verb} {result.blobs_deleted}; "
        f"abandoned publishes {result.publishes_dropped}, temp files {result.temp_removed}, "
        f"events pruned {result.events_pruned}"
    )


@app.command()
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


@app.command()
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
    _say(
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


@app.command("ls")
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


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``strata-hub``.

    Args:
        argv: The arguments after the program name; ``sys.argv[1:]`` by default.

    Returns:
        The exit code: 0 on success, 2 for bad input, 1 for system failures.
    """
    logging.basicConfig(
        stream=sys.stderr, level=logging.WARNING, format=f"{PROG}: %(levelname)s: %(message)s"
    )
    args = list(argv) if argv is not None else sys.argv[1:]
    previous = os.umask(PRIVATE_UMASK)  # whatever the caller's umask: hub files are private
    try:
        code, outcome = _run(args)
        audit = _audit_target(args)
        if audit is not None:
            audit.record(who=operator(), what=" ".join([PROG, *args]), outcome=outcome)
            audit.close()
    finally:
        os.umask(previous)
    return code


_AUDITED = {"publish", "tag", "untag", "revoke", "gc", "token"}


def _option(args: list[str], name: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.partition("=")[2]
    return None


def _audit_target(args: list[str]) -> AuditLog | None:
    """The audit log of a command that changes the catalog or the tokens (None for others):
    ``DATA_DIR/audit.jsonl``, or next to the token file for ``token``."""
    if not args or args[0] not in _AUDITED or "--help" in args:
        return None
    if args[0] == "token":
        if len(args) < 2 or args[1] == "list":
            return None
        tokens = _option(args, "--tokens") or os.environ.get("STRATA_HUB_TOKENS")
        return AuditLog(Path(tokens).parent / "audit.jsonl") if tokens else None
    data_dir = _option(args, "--data-dir") or os.environ.get("STRATA_HUB_DATA_DIR")
    if not data_dir or not Path(data_dir).is_dir():
        return None
    try:  # never write into a directory another user could change (the command refused it)
        secure(Path(data_dir))
    except (HubError, OSError):
        return None
    return AuditLog(Path(data_dir) / "audit.jsonl")


def _run(args: list[str]) -> tuple[int, str]:
    """Runs the command; returns the exit code and the outcome for the audit log."""
    command = typer.main.get_command(app)
    try:
        result = command.main(args=args, prog_name=PROG, standalone_mode=False)
    except typer.TyperException as exc:  # usage errors: unknown command, missing option, ...
        _say(f"error: {exc.format_message()} (see {PROG} --help)")
        return EXIT_USAGE, f"usage error: {exc.format_message()}"
    except typer.Abort:
        _say("error: aborted")
        return EXIT_FAILURE, "aborted"
    except (StorageError, CorruptBlob, CorruptCatalog, CatalogUnavailable) as exc:
        _say(f"error: {exc}")
        return EXIT_FAILURE, f"error: {exc}"
    except HubError as exc:
        _say(f"error: {exc}")
        return EXIT_USAGE, f"error: {exc}"
    except OSError as exc:
        _say(f"error: {exc}")
        return EXIT_FAILURE, f"error: {exc}"
    code = result if isinstance(result, int) else 0
    return code, "ok" if code == 0 else f"exit {code}"


if __name__ == "__main__":
    sys.exit(main())
