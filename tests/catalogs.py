"""The catalog contract: the same tests on every catalog engine.

A test that takes the ``engine`` fixture runs twice: on the embedded LMDB catalog
(``DATA_DIR/catalog``) and on a shared PostgreSQL catalog (a fresh database on the
session's real server, :mod:`tests.pgserver`). It opens catalogs and publishes through
the :class:`CatalogAt` it gets, so both runs exercise the same code above the engine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hub.catalog import Catalog
from hub.publish.tree import PublishResult, publish
from hub.store.datadir import DataDir
from tests.pgserver import PostgresServer


@dataclass(frozen=True)
class CatalogAt:
    """Where a test's catalogs live.

    Attributes:
        name: ``"lmdb"`` or ``"postgres"``.
        url: The shared catalog's URL; None for the data directory's own.
    """

    name: str
    url: str | None

    def location(self, data: Path) -> str | Path:
        """The catalog of data directory ``data``."""
        return self.url if self.url is not None else data / "catalog"

    def open(self, data: Path, *, create: bool = True) -> Catalog:
        """Opens the catalog of data directory ``data``."""
        return Catalog(self.location(data), create=create)

    def datadir(self, data: Path, *, create: bool = False) -> DataDir:
        """Data directory ``data`` with this catalog."""
        return DataDir.open(data, create=create, catalog=self.url)

    def publish(
        self, data: Path | str | os.PathLike[str], *args: Any, **kwargs: Any
    ) -> PublishResult:
        """:func:`hub.publish.tree.publish` into this catalog (a shared one's first publish names
        ``DATA/blobs`` as its blob store, as an operator must)."""
        if self.url is not None:
            kwargs.setdefault("blobs", str(Path(data) / "blobs"))
        return publish(data, *args, catalog=self.url, **kwargs)

    def cli(self) -> list[str]:
        """The ``strata-hub`` options naming this catalog."""
        return ["--catalog", self.url] if self.url is not None else []


@pytest.fixture(params=["lmdb", "postgres"])
def engine(request: pytest.FixtureRequest) -> CatalogAt:
    """Each catalog engine in turn (see the module docstring)."""
    if request.param == "lmdb":
        return CatalogAt("lmdb", None)
    server: PostgresServer = request.getfixturevalue("pg_server")
    return CatalogAt("postgres", server.database())
