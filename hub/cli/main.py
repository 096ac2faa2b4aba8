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
                   [--config FILE]     (every option also STRATA_HUB_NAME or NAME in FILE)
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
from typing import Annotated, Any

import typer

from hub.audit import AuditLog, operator
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
from hub.cli.settings import CONFIG_ENV, SERVE_OPTIONS, HubServeSettings, serve_settings
from hub.cli.tokens import token_app
from hub.errors import (
    CatalogUnavailable,
    CorruptBlob,
    CorruptCatalog,
    HubError,
    StorageError,
)
from hub.modes import PRIVATE_UMASK
from hub.publish.tree import publish as publish_tree
from hub.serve.metrics import HubMetrics
from hub.serve.metricsendpoint import MetricsEndpoint
from hub.serve.server import HubServer
from hub.snapshot.blocks import DEFAULT_BLOCK_SIZE
from hub.store.datadir import secure
from strata_local.atomic import write_atomic
from strata_local.memory import limit_malloc_arenas
from strata_local.options import config_parameter, with_options

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


async def _serve(settings: HubServeSettings) -> None:
    """Runs the server until SIGINT or SIGTERM; start-up and shutdown in reverse order."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    config = settings.server_config()
    async with contextlib.AsyncExitStack() as stack:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
            stack.callback(loop.remove_signal_handler, signum)
        metrics = HubMetrics()
        if settings.metrics is not None:
            endpoint = MetricsEndpoint.start(settings.metrics, metrics)
            stack.callback(endpoint.close)
        server = await HubServer.start(
            settings.data_dir, settings.listen, metrics=metrics, config=config
        )
        stack.push_async_callback(server.stop, settings.grace)
        bulk_port = server.bulk.port if server.bulk is not None else None
        # the gRPC port file last: whoever waits for it finds the bulk port's written
        port_files = (settings.bulk_port_file, settings.port_file)
        for port_file, port in zip(port_files, (bulk_port, server.port), strict=True):
            if port_file is not None and port is not None:
                try:
                    _write_port_file(port_file, port)
                except OSError as exc:
                    raise HubError(f"cannot write port file {port_file}: {exc.strerror}") from exc
        print(f"{PROG}: serving {settings.data_dir} on {server.address}", flush=True)
        if bulk_port is not None:
            say(f"bulk block channel on port {bulk_port}")
        if settings.metrics is not None:
            say(f"metrics on http://{endpoint.address}/metrics")
        if config.catalog is not None:
            say(f"shared catalog {redact(config.catalog)}")
        await stop.wait()


@app.command()
@with_options(SERVE_OPTIONS, config_parameter(CONFIG_ENV))
def serve(**received: Any) -> None:
    """Serve the data directory's datasets over gRPC until SIGINT or SIGTERM.

    Also serves gRPC health checking and server reflection. Catalog changes made by
    other processes (publish, tag, revoke) reach Watch streams within a second. Every
    option may also be set by its STRATA_HUB_* variable or in the TOML file of --config
    (flags win, then variables).
    """
    settings = serve_settings(received)
    limit_malloc_arenas()  # before gRPC starts its threads (strata_local/memory.py)
    asyncio.run(_serve(settings))


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
