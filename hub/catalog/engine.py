"""Where a catalog's records live: the embedded LMDB environment or a shared PostgreSQL one.

Every part of the catalog works on one transaction API, LMDB's own subset: ``get``, ``put``
(with ``overwrite``), ``delete``, ``cursor`` (``set_range``, ``first``, ``next``, ``key``,
``value``, ``delete``, iteration from the current record) and ``stat(db)["entries"]``, with
the database handles of :data:`hub.catalog.schema.DB_NAMES`. An :class:`Engine` opens such
transactions:

- :class:`LmdbEngine` (the default, one machine): an LMDB environment in a directory; one
  writer at a time across processes, readers see the latest commit when they begin.
- :class:`hub.catalog.postgres.PostgresEngine` (``postgresql://…``): the same records in one
  table of a PostgreSQL database, so any number of hub replicas on any machines serve one
  catalog. Writers are serialized by a transaction-scoped advisory lock, so every write
  transaction sees every earlier commit, exactly as with LMDB's single writer; readers get
  a repeatable-read snapshot.

So the catalog's invariants (write-once versions, gap-free event sequence numbers, gc
serialized with publish protections) hold the same way on both: they rest only on
"write transactions are serial, each sees all earlier commits".
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import lmdb

from hub.catalog.env import DEFAULT_MAP_SIZE, acquire_env, release_env
from hub.catalog.locations import is_shared_location
from hub.errors import CatalogError


class Engine(Protocol):
    """What a catalog needs of the place its records live.

    Attributes:
        location: The directory or URL, as shown in messages (a URL without its password).
        dbs: The database handles by name (:data:`hub.catalog.schema.DB_NAMES`).
        shared: True when several machines may serve the catalog at once.
    """

    location: str
    dbs: dict[bytes, Any]
    shared: bool

    def begin(self, *, write: bool) -> contextlib.AbstractContextManager[Any]:
        """A transaction with LMDB's API, committed when the block ends without an error.

        Raises:
            CatalogError: The transaction could not be opened or committed
                (:class:`~hub.errors.CatalogUnavailable` when the engine is unreachable).
        """
        ...

    def used_bytes(self) -> int:
        """Bytes the catalog's records take in the engine."""
        ...

    def close(self) -> None:
        """Releases the engine; repeated calls have no effect."""
        ...


class LmdbEngine:
    """A catalog in an LMDB environment directory (shared per process, reference counted).

    Args:
        path: The environment directory.
        create: Create it when missing.
        map_size: LMDB map size, bytes.

    Raises:
        CatalogError: No catalog at ``path`` (``create`` False), it cannot be opened, or it
            has another format.
    """

    shared = False

    def __init__(self, path: Path, *, create: bool, map_size: int) -> None:
        self.path = path
        self.location = str(path)
        self._key, env = acquire_env(path, create=create, map_size=map_size)
        self._env: lmdb.Environment | None = env.env
        self.dbs: dict[bytes, Any] = env.dbs

    @property
    def env(self) -> lmdb.Environment:
        """The open environment.

        Raises:
            CatalogError: The engine was closed.
        """
        if self._env is None:
            raise CatalogError(f"catalog at {self.location} is closed")
        return self._env

    @contextlib.contextmanager
    def begin(self, *, write: bool) -> Iterator[lmdb.Transaction[bytes]]:
        """An LMDB transaction (see :meth:`Engine.begin`)."""
        if not write:
            with self.env.begin() as txn:
                yield txn
            return
        try:
            with self.env.begin(write=True) as txn:
                yield txn
        except lmdb.MapFullError as exc:
            raise CatalogError(
                f"catalog at {self.location} is full ({exc}); reopen it with a larger map size"
            ) from exc
        except lmdb.Error as exc:
            raise CatalogError(f"cannot write catalog at {self.location}: {exc}") from exc

    def used_bytes(self) -> int:
        """Bytes of the LMDB map in use (last page number + 1, times the page size)."""
        info, stat = self.env.info(), self.env.stat()
        return int((info["last_pgno"] + 1) * stat["psize"])

    def close(self) -> None:
        """Drops this engine's reference to the shared environment."""
        if self._env is not None:
            self._env = None
            release_env(self._key)


def open_engine(
    location: str | os.PathLike[str], *, create: bool, map_size: int = DEFAULT_MAP_SIZE
) -> Engine:
    """The engine ``location`` names: a PostgreSQL URL, else an LMDB directory.

    Args:
        location: ``postgresql://USER@HOST:PORT/DB?…`` (libpq's URI syntax), or a path.
        create: Create the catalog (directory, or table) when missing.
        map_size: LMDB map size, bytes (LMDB only).

    Raises:
        CatalogError: The catalog does not exist (``create`` False), cannot be opened, or
            was written in another format; :class:`~hub.errors.CatalogUnavailable` when a
            shared catalog's engine cannot be reached.
    """
    if is_shared_location(location):
        from hub.catalog.postgres import PostgresEngine

        return PostgresEngine(str(location), create=create)
    return LmdbEngine(Path(location), create=create, map_size=map_size)
