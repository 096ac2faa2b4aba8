"""How a catalog's location is written: an LMDB directory, or a PostgreSQL URL.

Kept apart from the engines so that naming a location (the CLI, the data directory) does
not import a database driver.
"""

from __future__ import annotations

import os
import re
import urllib.parse

POSTGRES_SCHEMES = ("postgresql://", "postgres://")
"""URL prefixes that name a PostgreSQL catalog (libpq connection URIs)."""

_PASSWORD = re.compile(r"(://[^:/@]*):[^@]*@")
"""A password in a URL's user information (``postgresql://USER:PASSWORD@HOST``)."""

_PASSWORD_PARAMETER = re.compile(r"(?i)(\b(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|[^&\s]*)")
"""A ``password=`` or ``sslpassword=`` (the client key's) parameter: in a URL's query
(``?password=…``, ``&sslpassword=…``) or a libpq key/value connection string
(``password=…``, quoted or not)."""


def is_shared_location(location: str | os.PathLike[str]) -> bool:
    """True when ``location`` names a shared (PostgreSQL) catalog, not an LMDB directory."""
    return isinstance(location, str) and location.startswith(POSTGRES_SCHEMES)


_QUERY_PARAMETER = re.compile(r"([?&])([^=&\s]+)=([^&\s]*)")
"""A URL query's ``NAME=VALUE``: its name may be percent-encoded (``%70assword``), which
libpq decodes."""

_SECRET_NAMES = frozenset({"password", "sslpassword"})


def _query_secret(match: re.Match[str]) -> str:
    lead, name, _value = match.groups()
    if urllib.parse.unquote(name).lower() in _SECRET_NAMES:
        return f"{lead}{name}=***"
    return match.group(0)


def redact(text: str) -> str:
    """``text`` with every password of a catalog URL or connection string in it replaced by
    ``***`` (for messages, logs and the audit log's command lines): the user
    information's (``USER:PASSWORD@``) and any ``password=`` parameter's (libpq connection
    URIs and key/value strings, https://www.postgresql.org/docs/current/libpq-connect.html)."""
    text = _PASSWORD.sub(r"\1:***@", text)
    text = _QUERY_PARAMETER.sub(_query_secret, text)
    return _PASSWORD_PARAMETER.sub(r"\1***", text)
