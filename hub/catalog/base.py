"""The catalog's handle on its environment and its transactions.

:class:`CatalogBase` owns its engine (:mod:`hub.catalog.engine`: LMDB, or PostgreSQL) and opens
transactions as :class:`~hub.catalog.txn.CatalogTxn`: :meth:`CatalogBase.read` and
:meth:`CatalogBase.write` are the public surface every part of the catalog (and a
publish session) writes through.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from types import TracebackType
from typing import Self

from hub.catalog.engine import Engine, open_engine
from hub.catalog.env import DEFAULT_MAP_SIZE
from hub.catalog.txn import CatalogTxn
from hub.errors import CatalogError


class CatalogBase:
    """An open catalog (see :class:`hub.catalog.Catalog`) in the engine ``location`` names.

    Args:
        location: An LMDB environment directory, or a ``postgresql://`` URL
            (:func:`hub.catalog.engine.open_engine`).
        create: Create the catalog when missing; when False a missing catalog raises.
        map_size: LMDB map size, bytes; the upper bound of the catalog's size (LMDB only).

    Raises:
        CatalogError: The catalog does not exist (``create`` False), cannot be opened, or
            was written in another format; :class:`~hub.errors.CatalogUnavailable` when a
            shared catalog's engine cannot be reached.
    """

    def __init__(
        self,
        location: str | os.PathLike[str],
        *,
        create: bool = True,
        map_size: int = DEFAULT_MAP_SIZE,
    ) -> None:
        self._engine: Engine | None = open_engine(location, create=create, map_size=map_size)
        self.location = self._engine.location
        self.shared = self._engine.shared
        self._db = self._engine.dbs

    def close(self) -> None:
        """Releases the engine; further calls fail. Repeated calls have no effect."""
        if self._engine is not None:
            engine, self._engine = self._engine, None
            engine.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def engine(self) -> Engine:
        """The engine the records live in.

        Raises:
            CatalogError: The catalog was closed.
        """
        if self._engine is None:
            raise CatalogError(f"catalog at {self.location} is closed")
        return self._engine

    @contextlib.contextmanager
    def read(self) -> Iterator[CatalogTxn]:
        """A read transaction: sees the latest commit (of any process) when it opens.

        Raises:
            CatalogError: The catalog was closed, or its engine failed.
        """
        with self.engine.begin(write=False) as txn:
            yield CatalogTxn(txn, self._db)

    @contextlib.contextmanager
    def write(self) -> Iterator[CatalogTxn]:
        """A write transaction, committed when the block ends (aborted on an exception).

        Writers are serial across processes (and, on a shared engine, replicas); keep the
        block short.

        Raises:
            CatalogError: The catalog is full (reopen with a larger map size), closed, or
                cannot be written; :class:`~hub.errors.CatalogUnavailable` when a shared
                engine cannot be reached.
        """
        with self.engine.begin(write=True) as txn:
            yield CatalogTxn(txn, self._db)
