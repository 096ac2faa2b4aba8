"""``strata-hub``: serve, publish and list datasets.

```
strata-hub serve   --data-dir DIR --listen HOST:PORT [--metrics HOST:PORT] [--port-file PATH]
strata-hub publish --data-dir DIR DATASET SRC_DIR [--tag latest] [--block-size BYTES]
strata-hub ls      --data-dir DIR [DATASET]
```

Output contract: ``serve`` prints exactly one line, ``strata-hub: serving DIR on HOST:PORT``
(the bound port), to stdout once it accepts calls, and exits 0 on SIGINT or SIGTERM after
a grace period. ``publish`` prints the new version (e.g. ``v3``) on stdout and a summary
on stderr. Every error is one line on stderr, ``strata-hub: error: ...``, with exit code 2
for bad input (usage, names, paths, addresses) and 1 for system failures (I/O errors).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer

from hub.blocks import DEFAULT_BLOCK_SIZE
from hub.catalog import Catalog
from hub.datadir import DataDir
from hub.errors import HubError
from hub.metrics import HubMetrics, MetricsEndpoint
from hub.publish import publish as publish_tree
from hub.server import GRACE_SECONDS, HubServer

PROG = "strata-hub"
EXIT_USAGE = 2
EXIT_FAILURE = 1

app = typer.Typer(
    name=PROG,
    help="Strata hub: versioned, immutable dataset snapshots served over gRPC.",
    add_completion=False,
    pretty_exceptions_enable=False,
)

DataDirOption = Annotated[
    Path,
    typer.Option(
        "--data-dir",
        envvar="STRATA_HUB_DATA_DIR",
        help="Hub data directory (catalog/ and blobs/).",
        show_default=False,
    ),
]


def _say(message: str) -> None:
    """Writes one line to stderr, prefixed with the program name."""
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def _write_port_file(path: Path, port: int) -> None:
    """Writes ``port`` and a newline to ``path`` atomically (temp file, then rename)."""
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as stream:
            stream.write(f"{port}\n")
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


async def _serve(
    data_dir: Path, listen: str, metrics_listen: str | None, port_file: Path | None
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
            endpoint = MetricsEndpoint.start(metrics_listen, metrics.registry)
            stack.callback(endpoint.close)
        server = await HubServer.start(data_dir, listen, metrics=metrics)
        stack.push_async_callback(server.stop, GRACE_SECONDS)
        if port_file is not None:
            try:
                _write_port_file(port_file, server.port)
            except OSError as exc:
                raise HubError(f"cannot write port file {port_file}: {exc.strerror}") from exc
        print(f"{PROG}: serving {data_dir} on {server.address}", flush=True)
        if metrics_listen is not None:
            _say(f"metrics on http://{endpoint.address}/metrics")
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
) -> None:
    """Serve the data directory's datasets over gRPC until SIGINT or SIGTERM."""
    asyncio.run(_serve(data_dir, listen, metrics, port_file))


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
) -> None:
    """Publish SRC_DIR as the next version of DATASET; prints the new version."""
    result = publish_tree(data_dir, dataset, src_dir, tag=tag, block_size=block_size)
    print(result.version, flush=True)
    _say(
        f"published {result.dataset} {result.version} (tag {tag}): {result.files} files, "
        f"{result.bytes} bytes, {result.new_blocks} new blocks, {result.new_bytes} new bytes, "
        f"snapshot {result.snapshot_id}"
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


@app.command("ls")
def ls(
    data_dir: DataDirOption,
    dataset: Annotated[
        str | None,
        typer.Argument(metavar="DATASET", help="List this dataset's versions and tags."),
    ] = None,
) -> None:
    """List datasets, or one dataset's versions with their tags."""
    layout = DataDir.open(data_dir, create=False)
    with Catalog(layout.catalog_path, create=False) as catalog:
        if dataset is None:
            datasets = catalog.list_datasets()
            print(
                _table(
                    ("DATASET", "VERSIONS", "LATEST"),
                    [(d.name, str(d.version_count), d.latest_version) for d in datasets],
                )
            )
            return
        versions = catalog.list_versions(dataset)
        tags: dict[str, list[str]] = {}
        for tag in catalog.list_tags(dataset):
            tags.setdefault(tag.version, []).append(tag.name)
    print(
        _table(
            ("VERSION", "CREATED", "FILES", "BYTES", "SNAPSHOT", "TAGS"),
            [
                (
                    s.version,
                    _timestamp(s.created_ns),
                    str(s.file_count),
                    str(s.total_bytes),
                    s.snapshot_id,
                    ",".join(tags.get(s.version, [])),
                )
                for s in versions
            ],
        )
    )


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
    command = typer.main.get_command(app)
    try:
        result = command.main(
            args=list(argv) if argv is not None else None, prog_name=PROG, standalone_mode=False
        )
    except typer.TyperException as exc:  # usage errors: unknown command, missing option, ...
        _say(f"error: {exc.format_message()} (see {PROG} --help)")
        return EXIT_USAGE
    except typer.Abort:
        _say("error: aborted")
        return EXIT_FAILURE
    except HubError as exc:
        _say(f"error: {exc}")
        return EXIT_USAGE
    except OSError as exc:
        _say(f"error: {exc}")
        return EXIT_FAILURE
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
