"""Where a run's data is: a local path or an object-store URL, and the options to open it.

``--data`` is a local directory (or the same directory through a Strata mount) or a URL
fsspec has a filesystem for (``s3://bucket/f3.mdio``, ``gs://...``); ``--storage-option
KEY=VALUE`` flags become that filesystem's keyword arguments. This module imports
nothing heavy, so the command line's ``--help`` stays fast; :mod:`trainer.volume` opens
the store.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, TypeGuard
from urllib.parse import unquote, urlsplit

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*(::[A-Za-z][A-Za-z0-9+.-]*)*://")
"""``scheme://``, or an fsspec chain such as ``simplecache::s3://``."""


StorageOptions = Mapping[str, Any]
"""Keyword arguments of an fsspec filesystem (e.g. s3fs's ``endpoint_url``, ``anon``)."""


def is_url(path: str | Path) -> TypeGuard[str]:
    """Whether a data path is a URL (``scheme://...``) rather than a local path."""
    return isinstance(path, str) and _URL.match(path) is not None


def data_path(text: str) -> str | Path:
    """A ``--data`` argument as the trainer keeps it.

    A URL stays the string it is (``Path`` would fold ``s3://b/k`` into ``s3:/b/k``),
    except ``file://`` URLs, which become the local path they name; anything else is a
    local :class:`~pathlib.Path`, exactly as before URLs were accepted.

    Args:
        text: The argument.

    Returns:
        The URL string, or a local path.
    """
    if text.startswith("file://"):
        return Path(unquote(urlsplit(text).path))
    return text if is_url(text) else Path(text)


def url_parts(url: str) -> PurePosixPath:
    """A URL's bucket (host) and key as one POSIX path: ``s3://b/d/v/x.mdio`` (or
    ``simplecache::s3://b/d/v/x.mdio``) is ``b/d/v/x.mdio``, for reading names off it
    as off a mount path."""
    parts = urlsplit(url.rsplit("::", 1)[-1])
    return PurePosixPath(parts.netloc + parts.path)


def parse_storage_options(items: Sequence[str]) -> dict[str, Any]:
    """``--storage-option KEY=VALUE`` flags as fsspec keyword arguments.

    A value that parses as JSON is taken as JSON (``anon=true``, ``max_concurrency=16``,
    ``client_kwargs={"region_name": "eu-west-1"}``); any other value is a string
    (``endpoint_url=http://127.0.0.1:8333``).

    Args:
        items: The flags' values, in order; a later key replaces an earlier one.

    Returns:
        The options.

    Raises:
        ValueError: An item is not ``KEY=VALUE`` with a non-empty key.
    """
    options: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--storage-option expects KEY=VALUE, got {item!r}")
        try:
            options[key.strip()] = json.loads(value)
        except ValueError:
            options[key.strip()] = value
    return options
