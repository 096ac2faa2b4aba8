"""The catalog's LMDB environment: opened once per process and directory, format-stamped.

LMDB forbids opening one environment twice in a process, so :class:`~hub.catalog.Catalog`
objects on one directory share an environment (reference counted). Source: LMDB's
documentation, http://www.lmdb.tech/doc/.
"""

from __future__ import annotations

import threading
from pathlib import Path

import lmdb

from hub.catalog.schema import DB_NAMES, META_FORMAT, U32
from hub.errors import CatalogError

CATALOG_FORMAT = 2
"""On-disk format of the catalog's records; a catalog of another format is refused."""

DEFAULT_MAP_SIZE = 64 * 1024**3
"""LMDB map size, bytes (64 GiB of address space; the file grows only as data is written)."""


class SharedEnv:
    """One LMDB environment and its named databases, shared by the catalogs of a process."""

    def __init__(self, env: lmdb.Environment, dbs: dict[bytes, lmdb._Database]) -> None:
        self.env = env
        self.dbs = dbs
        self.refs = 0


_shared_envs: dict[Path, SharedEnv] = {}
_shared_envs_lock = threading.Lock()


def check_format(
    txn: lmdb.Transaction[bytes], meta: lmdb._Database, datasets: lmdb._Database, path: Path
) -> None:
    """Stamps a new catalog with :data:`CATALOG_FORMAT`; refuses one of another format.

    Raises:
        CatalogError: The catalog has another format, or none but holds datasets.
    """
    stamp = txn.get(META_FORMAT, db=meta)
    if stamp is None:
        if txn.stat(datasets)["entries"]:
            raise CatalogError(
                f"catalog at {path} has no format stamp (written by an older hub); "
                f"this hub reads format {CATALOG_FORMAT}"
            )
        txn.put(META_FORMAT, U32.pack(CATALOG_FORMAT), db=meta)
        return
    (found,) = U32.unpack(stamp)
    if found != CATALOG_FORMAT:
        raise CatalogError(
            f"catalog at {path} has format {found}; this hub reads format {CATALOG_FORMAT}"
        )


def acquire_env(path: Path, *, create: bool, map_size: int) -> tuple[Path, SharedEnv]:
    """Opens (or shares) the environment at ``path``; release with :func:`release_env`.

    Returns:
        The key to release it by, and the shared environment.

    Raises:
        CatalogError: No catalog at ``path`` (``create`` False), it cannot be opened, or
            it has another format.
    """
    if not create and not (path / "data.mdb").is_file():
        raise CatalogError(f"no catalog at {path} (nothing published yet?)")
    with _shared_envs_lock:
        key = path.resolve()
        shared = _shared_envs.get(key)
        if shared is None:
            try:
                if create:
                    path.mkdir(parents=True, exist_ok=True, mode=0o700)
                env = lmdb.open(  # data.mdb and lock.mdb owner-only (mode): the catalog is private
                    str(path),
                    map_size=map_size,
                    max_dbs=len(DB_NAMES),
                    subdir=True,
                    create=create,
                    mode=0o700,
                )
                try:
                    with env.begin(write=True) as txn:
                        dbs = {name: env.open_db(name, txn=txn) for name in DB_NAMES}
                        check_format(txn, dbs[b"meta"], dbs[b"datasets"], path)
                except BaseException:
                    env.close()
                    raise
            except (lmdb.Error, OSError) as exc:
                raise CatalogError(f"cannot open catalog at {path}: {exc}") from exc
            shared = SharedEnv(env, dbs)
            _shared_envs[key] = shared
        shared.refs += 1
        return key, shared


def release_env(key: Path) -> None:
    """Drops one reference to a shared environment, closing it with the last one."""
    with _shared_envs_lock:
        shared = _shared_envs[key]
        shared.refs -= 1
        if shared.refs == 0:
            del _shared_envs[key]
            shared.env.close()
