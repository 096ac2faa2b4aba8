"""``strata-hub``: serve, publish, tag, revoke, collect garbage, verify and list datasets.

```
strata-hub serve   --data-dir DIR --listen HOST:PORT [--metrics HOST:PORT] [--port-file PATH]
                   [--tls-cert PEM --tls-key PEM [--client-ca PEM]] [--tokens FILE [--insecure]]
                   [--max-message-bytes N] [--max-connections N] [--handshake-timeout S]
                   [--max-streams-per-token N] [--max-block-streams N] [--max-bytes-per-token N]
                   [--max-bytes-in-flight N] [--budget-wait S] [--stall-timeout S]
                   [--grant-holders-per-token N]
                   [--max-manifest-streams N] [--max-watch-streams N]
                   [--bulk-port PORT [--bulk-port-file PATH] [--bulk-max-connections N]]
                   [--grace SECONDS] [--blobs DIR|s3://B/P]
                   [--grant-key PEM] [--grant-lifetime SECONDS] [--rotate-grant-key]
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
strata-hub token   create|list|revoke|migrate --tokens FILE ...   (see hub/cli/tokens.py)
```

Every command runs under umask 077 and keeps the data directory owner-only
(:mod:`hub.store.datadir`).

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
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer

from hub.audit import DEFAULT_BACKUPS, DEFAULT_MAX_BYTES, AuditLog, operator
from hub.auth.grants import DEFAULT_LIFETIME_S, HOLDERS_PER_TOKEN
from hub.auth.signing import keygen as keygen_pair
from hub.catalog.locations import redact
from hub.cli.catalog import register as register_catalog_commands
from hub.cli.options import (
    PROG,
    BlobsOption,
    CatalogOption,
    DataDirOption,
    S3EndpointOption,
    say,
)
from hub.cli.tokens import token_app
from hub.errors import (
    CatalogUnavailable,
    ConfigError,
    CorruptBlob,
    CorruptCatalog,
    HubError,
    StorageError,
)
from hub.limits.budget import (
    BYTES_PER_TOKEN,
    STALL_S,
    STREAMS,
    STREAMS_PER_TOKEN,
    TOTAL_BYTES,
    WAIT_S,
)
from hub.limits.sizes import HANDSHAKE_TIMEOUT_S, MAX_CONNECTIONS
from hub.limits.streams import MANIFEST_STREAMS, WATCH_STREAMS
from hub.modes import PRIVATE_UMASK
from hub.publish.tree import publish as publish_tree
from hub.serve.bulk import MAX_CONNECTIONS as BULK_CONNECTIONS
from hub.serve.config import MAX_MESSAGE_BYTES, ServerConfig
from hub.serve.metrics import HubMetrics, MetricsEndpoint
from hub.serve.server import GRACE_SECONDS, HubServer
from hub.snapshot.blocks import DEFAULT_BLOCK_SIZE
from hub.store.datadir import secure
from strata_local.atomic import write_atomic
from strata_local.memory import limit_malloc_arenas

EXIT_USAGE = 2
EXIT_FAILURE = 1

app = typer.Typer(
    name=PROG,
    help="Strata hub: versioned, immutable dataset snapshots served over gRPC.",
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(token_app)


def _write_port_file(path: Path, port: int) -> None:
    """Writes ``port`` and a newline to ``path`` atomically (temp file, then rename)."""
    write_atomic(path, f"{port}\n".encode())


async def _serve(
    data_dir: Path,
    listen: str,
    metrics_listen: str | None,
    port_files: tuple[Path | None, Path | None],
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
        bulk_port = server.bulk.port if server.bulk is not None else None
        for port_file, port in zip(port_files, (server.port, bulk_port), strict=True):
            if port_file is not None and port is not None:
                try:
                    _write_port_file(port_file, port)
                except OSError as exc:
                    raise HubError(f"cannot write port file {port_file}: {exc.strerror}") from exc
        print(f"{PROG}: serving {data_dir} on {server.address}", flush=True)
        if bulk_port is not None:
            say(f"bulk block channel on port {bulk_port}")
        if metrics_listen is not None:
            say(f"metrics on http://{endpoint.address}/metrics")
        if config.catalog is not None:
            say(f"shared catalog {redact(config.catalog)}")
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
        typer.Option(
            "--max-message-bytes",
            help="Largest gRPC message sent (requests have their own limit, 32 KiB).",
        ),
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
    max_block_streams: Annotated[
        int,
        typer.Option(
            "--max-block-streams",
            help="Most ReadBlocks streams open at once over every token; more are refused "
            "(RESOURCE_EXHAUSTED).",
        ),
    ] = STREAMS,
    max_bytes_per_token: Annotated[
        int,
        typer.Option(
            "--max-bytes-per-token",
            help="Most bytes the hub holds for one token's ReadBlocks streams (blocks "
            "unread by the client) and requests still arriving; a stream waits for room, "
            "up to --budget-wait.",
        ),
    ] = BYTES_PER_TOKEN,
    max_bytes_in_flight: Annotated[
        int,
        typer.Option(
            "--max-bytes-in-flight",
            help="Most bytes the hub holds for every token's streams and requests together.",
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
    stall_timeout: Annotated[
        float,
        typer.Option(
            "--stall-timeout",
            help="Seconds one MiB of a block's bytes (a ReadBlocks message, a bulk "
            "channel step) may take to leave; a smaller message gets its share, at least "
            "2 s (a stream's first messages are 64 KiB). Then the stream is ended "
            "(RESOURCE_EXHAUSTED; a bulk connection is closed) and its share of the byte "
            "budget given back. A slow reader that keeps reading is not cut.",
        ),
    ] = STALL_S,
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
    rotate_grant_key: Annotated[
        bool,
        typer.Option(
            "--rotate-grant-key",
            help="With --catalog: make this replica's --grant-key the one every replica "
            "signs with (replicas refuse to start with another key than the recorded one).",
        ),
    ] = False,
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
    bulk_port: Annotated[
        int | None,
        typer.Option(
            "--bulk-port",
            help="Also serve block bytes on this port of --listen's host, beside gRPC "
            "(the bulk channel: sendfile, same tokens, TLS and limits); 0 picks a free port.",
        ),
    ] = None,
    bulk_port_file: Annotated[
        Path | None,
        typer.Option("--bulk-port-file", help="Write the bound bulk port to this file."),
    ] = None,
    bulk_max_connections: Annotated[
        int,
        typer.Option(
            "--bulk-max-connections",
            help="Most bulk connections open at once (a spoke holds one per fetch worker).",
        ),
    ] = BULK_CONNECTIONS,
) -> None:
    """Serve the data directory's datasets over gRPC until SIGINT or SIGTERM.

    Also serves gRPC health checking and server reflection. Catalog changes made by
    other processes (publish, tag, revoke) reach Watch streams within a second.
    """
    if bulk_port is None and (
        bulk_port_file is not None or bulk_max_connections != BULK_CONNECTIONS
    ):
        raise ConfigError("--bulk-port-file and --bulk-max-connections need --bulk-port")
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
        rotate_grant_key=rotate_grant_key,
        audit_log=audit_log,
        audit_max_bytes=audit_max_bytes,
        audit_backups=audit_backups,
        max_connections=max_connections,
        handshake_timeout_s=handshake_timeout,
        max_streams_per_token=max_streams_per_token,
        max_block_streams=max_block_streams,
        max_bytes_per_token=max_bytes_per_token,
        max_bytes_in_flight=max_bytes_in_flight,
        budget_wait_s=budget_wait,
        stall_timeout_s=stall_timeout,
        grant_holders_per_token=grant_holders_per_token,
        max_manifest_streams=max_manifest_streams,
        max_watch_streams=max_watch_streams,
        bulk_port=bulk_port,
        bulk_max_connections=bulk_max_connections,
    )
    limit_malloc_arenas()  # before gRPC starts its threads (strata_local/memory.py)
    asyncio.run(_serve(data_dir, listen, metrics, (port_file, bulk_port_file), config, grace))


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
    readable_by_all: Annotated[
        bool,
        typer.Option(
            "--readable-by-all",
            help="Record every file readable (and every directory searchable) by any "
            "uid, whatever SRC_DIR's modes: for pods that run as any user.",
        ),
    ] = False,
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
        readable_by_all=readable_by_all,
    )
    print(result.version, flush=True)
    say(
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
    say(f"wrote signing key {private} and public key {public}")


register_catalog_commands(app)


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
            what = " ".join(redact(arg) for arg in [PROG, *args])  # no catalog password
            audit.record(who=operator(), what=what, outcome=redact(outcome))
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
        say(f"error: {exc.format_message()} (see {PROG} --help)")
        return EXIT_USAGE, f"usage error: {exc.format_message()}"
    except typer.Abort:
        say("error: aborted")
        return EXIT_FAILURE, "aborted"
    except (StorageError, CorruptBlob, CorruptCatalog, CatalogUnavailable) as exc:
        say(f"error: {exc}")
        return EXIT_FAILURE, f"error: {exc}"
    except HubError as exc:
        say(f"error: {exc}")
        return EXIT_USAGE, f"error: {exc}"
    except OSError as exc:
        say(f"error: {exc}")
        return EXIT_FAILURE, f"error: {exc}"
    code = result if isinstance(result, int) else 0
    return code, "ok" if code == 0 else f"exit {code}"


if __name__ == "__main__":
    sys.exit(main())
