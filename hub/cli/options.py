"""What every ``strata-hub`` command module shares: the program name, its one-line
messages and the options several commands take (:mod:`hub.cli.main`, :mod:`hub.cli.catalog`,
:mod:`hub.cli.tokens`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from hub.catalog.locations import redact

PROG = "strata-hub"


def say(message: str) -> None:
    """Writes one line to stderr, prefixed with the program name, with any catalog
    password in it redacted (:func:`hub.catalog.locations.redact`)."""
    print(f"{PROG}: {redact(message)}", file=sys.stderr, flush=True)


DATA_DIR_HELP = "Hub data directory (catalog/ and blobs/)."
CATALOG_HELP = (
    "A shared catalog, postgresql://USER@HOST:PORT/DB (libpq's URI; the password best in "
    "$PGPASSFILE), that several hub replicas serve (default: DATA_DIR/catalog, this "
    "machine's own). The first command on a new one must name --blobs."
)
BLOBS_HELP = (
    "Blob store: a directory or s3://BUCKET/PREFIX (default: the one the catalog records, "
    "else DATA_DIR/blobs)."
)
S3_ENDPOINT_HELP = "S3 endpoint URL for s3:// blob stores (default: AWS, or $AWS_ENDPOINT_URL)."
"""The help of the options ``serve`` shares with the other commands: its own are declared
in :mod:`hub.cli.settings`, these beside them."""

DataDirOption = Annotated[
    Path,
    typer.Option(
        "--data-dir", envvar="STRATA_HUB_DATA_DIR", help=DATA_DIR_HELP, show_default=False
    ),
]
CatalogOption = Annotated[
    str | None,
    typer.Option("--catalog", envvar="STRATA_HUB_CATALOG", help=CATALOG_HELP, show_default=False),
]
BlobsOption = Annotated[
    str | None,
    typer.Option("--blobs", envvar="STRATA_HUB_BLOBS", help=BLOBS_HELP, show_default=False),
]
S3EndpointOption = Annotated[
    str | None,
    typer.Option(
        "--s3-endpoint", envvar="STRATA_HUB_S3_ENDPOINT", help=S3_ENDPOINT_HELP, show_default=False
    ),
]

DatasetArgument = Annotated[
    str, typer.Argument(metavar="DATASET", help="Dataset name, e.g. f3.", show_default=False)
]
