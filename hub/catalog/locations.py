"""How a catalog's location is written: an LMDB directory, or a PostgreSQL URL.

Kept apart from the engines so that naming a location (the CLI, the data directory) does
not import a database driver.
"""

from __future__ import annotations

import os
import re

POSTGRES_SCHEMES = ("postgresql://", "postgres://")
"""URL prefixes that name a PostgreSQL catalog (libpq connection URIs)."""

_PASSWORD = re.compile(r"(://[^:/@]*):[^@]*@")


def is_shared_location(location: str | os.PathLike[str]) -> bool:
    """True when ``location`` names a shared (PostgreSQL) catalog, not an LMDB directory."""
    return isinstance(location, str) and location.startswith(POSTGRES_SCHEMES)


def redact(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for messages and logs)."""
    return _PASSWORD.sub(r"\1:***@", url)
