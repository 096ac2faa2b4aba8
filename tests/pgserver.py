"""The tests' PostgreSQL server: :class:`deploy.postgres.PostgresServer` as fixtures.

The ``pg_server`` fixture is one server per test session and worker (its directory made
directly under the temporary directory: pytest's own is private to root, and the server
may run as ``postgres``); ``pg_url`` is a fresh database on it. Tests are skipped where
the package is missing, except under CI (``$CI``), where that fails.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.postgres import PostgresServer, postgres_bin

__all__ = ["PostgresServer", "pg_server", "pg_url"]


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the session (import it into a test module to use it).

    Its directory is made directly under the temporary directory: pytest's own is
    private to root, and the server may run as ``postgres``."""
    if postgres_bin() is None:
        message = "PostgreSQL is not installed (Debian package postgresql)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    server = PostgresServer(Path(tempfile.mkdtemp(prefix="strata-pg-")))
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def pg_url(pg_server: PostgresServer) -> str:
    """The URL of a fresh, empty database on the session's server."""
    return pg_server.database()
