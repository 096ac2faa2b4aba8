"""What every ``strata-train`` command shares (:mod:`trainer.cli`, :mod:`trainer.datacli`):
the ``--data`` help, the ``--storage-option`` flag and its parsing, and :func:`fail`, the
one-line error with exit status :data:`EXIT_USAGE`.
"""

from __future__ import annotations

from typing import Annotated, NoReturn

import typer

from trainer.location import parse_storage_options

EXIT_USAGE = 2


DATA_HELP = (
    "Zarr/MDIO store (read-only): a directory, or a URL such as s3://bucket/f3.mdio "
    "read through fsspec (endpoint and credentials from the environment, e.g. "
    "AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, or --storage-option)."
)

StorageOptionFlag = Annotated[
    list[str] | None,
    typer.Option(
        "--storage-option",
        help="KEY=VALUE passed to the URL's fsspec filesystem (repeatable; JSON values "
        "such as true or 16 are parsed; ignored for a local path).",
    ),
]


def storage_options(items: list[str] | None) -> dict[str, object]:
    """``--storage-option`` values as a dict (a bad one is a one-line error)."""
    try:
        return parse_storage_options(items or [])
    except ValueError as exc:
        fail(str(exc))


def fail(message: str) -> NoReturn:
    """Print a one-line error on stderr and exit with status 2."""
    line = " ".join(message.split())
    typer.echo(f"strata-train: error: {line}", err=True)
    raise typer.Exit(EXIT_USAGE)
