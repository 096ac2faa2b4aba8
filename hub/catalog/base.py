"""The catalog's handle on its environment and its transactions.

:class:`CatalogBase` owns one reference to the shared LMDB environment and opens
transactions as :class:`~hub.catalog.txn.CatalogTxn`: :meth:`CatalogBase.read` and
:meth:`CatalogBase.write` are the public surface every part of the catalog (and a
publish session) writes through.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Self

import lmdb

from hub.catalog.env import DEFAULT_MAP_SIZE, acquire_env, release_env
from hub.catalog.txn import CatalogTxn
from hub.errors import CatalogError


class CatalogBase:
    """An open catalog environment (see :class:`hub.catalog.Catalog`).

    Args:
        path: The environment directory.
        create: Create the environment when missing; when False a missing catalog raises.
        map_size: LMDB map size, bytes; the upper bound of the catalog's size.

    Raises:
        CatalogError: The catalog does not exist (``create`` False), cannot be opened, or
            was written in another format.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        create: bool = True,
        map_size: int = DEFAULT_MAP_SIZE,
    ) -> None:
        self.path = Path(path)
        self._key, shared = acquire_env(self.path, create=create, map_size=map_size)
        self._env: lmdb.Environment | None = shared.env
        self._db = shared.dbs

    def close(self) -> None:
        """Releases the environment; further calls fail. Repeated calls have no effect."""
        if self._env is not None:
            self._env = None
            release_env(self._key)

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
    def env(self) -> lmdb.Environment:
        """The open LMDB environment.

        Raises:
            CatalogError: The catalog was closed.
        """
        if self._env is None:
            raise CatalogError(f"catalog at {self.path} is closed")
        return self._env

    @contextlib.contextmanager
    def read(self) -> Iterator[CatalogTxn]:
        """A read transaction: sees the latest commit (of any process) when it opens.

        Raises:
            CatalogError: The catalog was closed.
        """
        with self.env.begin() as txn:
            yield CatalogTxn(txn, self._db)

    @contextlib.contextmanager
    def write(self) -> Iterator[CatalogTxn]:
        """A write transaction, committed when the block ends (aborted on an exception).

        LMDB admits one writer at a time across processes; keep the block short.

        Raises:
            CatalogError: The catalog is full (reopen with a larger map size), closed, or
                cannot be written.
        """
        try:
            with self.env.begin(write=True) as txn:
                yield CatalogTxn(txn, self._db)
        except lmdb.MapFullError as exc:
            raise CatalogError(
                f"catalog at {self.path} is full ({exc}); reopen it with a larger map size"
            ) from exc
        except lmdb.Error as exc:
            raise CatalogError(f"cannot write catalog at {self.path}: {exc}") from exc
