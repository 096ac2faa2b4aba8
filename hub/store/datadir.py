"""The layout of a hub's data directory.

```
DATA_DIR/
  catalog/      LMDB environment: datasets, versions, tags, snapshots, manifests (hub.catalog)
  blobs/        content-addressed block files, blobs/<first 2 hex>/<digest> (hub.store.blobstore)
  audit.jsonl   changing commands and refused calls (hub.audit)
  known-callers.json  who proved a token from which address lately (strata_local.knownhosts)
```

Everything in it is owner-only, whatever the umask the hub was started with: the catalog
names every dataset and digest (whatever a token's scope) and the blobs are the data.
Directories are made 0700 and files 0600 with explicit modes (LMDB's ``mode``,
``mkstemp``, ``os.open``), and :meth:`DataDir.open` tightens what an older version, another
umask or a volume's ``fsGroup`` left looser: the directory itself, ``catalog/`` and
``blobs/``, the files at its top and the catalog's files (the blob store tightens its own
fan-out, :class:`hub.store.blobstore.LocalBlobStore`). Before that, a data directory another
local user could change is refused (:func:`secure`): one that is theirs, sits where they
could replace it, or holds their files or a symlink. Links are never followed, and a
directory that is no data directory (no ``catalog/``, not empty) is left alone.

The catalog may live elsewhere too: ``--catalog postgresql://…`` (:mod:`hub.catalog.postgres`)
names a shared catalog that several hub replicas serve at once. The data directory then
keeps only what is the replica's own (the audit file, the port file, a grant key, the
known callers); the blob store must be one every replica reaches (an absolute path on
shared storage, or ``s3://``), and is recorded in the catalog like any other.

The blocks may live elsewhere (another directory, or ``s3://BUCKET/PREFIX``): the catalog
records where on first use (:meth:`DataDir.blob_store`), so ``publish``, ``serve`` and
``gc`` on one data directory always agree on the store.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from hub.catalog import Catalog
from hub.catalog.locations import is_shared_location, redact
from hub.errors import ConfigError, Conflict, DataDirNotFound, HubError, UnsafeDirectory
from hub.modes import DIR_MODE
from hub.store.blobstore import BlobStore, open_blob_store
from strata_local.ownership import UnsafePath, check_members, make_private, open_private_dir

DEFAULT_BLOBS = "blobs"
"""The default blob store location, relative to the data directory."""


def secure(root: Path) -> None:
    """Refuse a data directory another local user could change, then narrow it to
    owner-only: ``root``, ``catalog/`` and ``blobs/`` 0700, the files at its top and in
    ``catalog/`` 0600 (:mod:`strata_local.ownership`).

    Refused, before anything is read or written there: a directory on the way that
    another user owns or may write (unless sticky with the next step ours, as under
    ``/tmp``); ``root`` itself if another user's (or root's and writable by others); and,
    in a data directory, ``catalog/``, ``blobs/``, their entries or any file at the top
    (``audit.jsonl``, ``grant.key``, the port file) if another user's or a symlink. A
    directory that holds neither a catalog nor anything at all (a wrong ``--data-dir``)
    is checked up to itself and left as it is.

    Raises:
        UnsafeDirectory: one line naming what another user could change.
        OSError: the directory cannot be read or changed.
    """
    try:
        fd = open_private_dir(root)
        try:
            with os.scandir(fd) as entries:
                top = {entry.name for entry in entries}
            if top and "catalog" not in top:  # a catalog that is a symlink is refused below
                return
            make_private(fd)
            check_members(fd, root, subdirs=("catalog", DEFAULT_BLOBS))
        finally:
            os.close(fd)
    except UnsafePath as err:
        raise UnsafeDirectory(f"data dir {root}: {err}") from None


@dataclass(frozen=True, slots=True)
class DataDir:
    """A hub data directory.

    Attributes:
        root: The directory itself.
        catalog_url: A shared catalog's URL (``postgresql://…``), or None for the
            embedded one in ``DATA_DIR/catalog``.
    """

    root: Path
    catalog_url: str | None = None

    @property
    def catalog_path(self) -> Path:
        """The LMDB environment directory, ``DATA_DIR/catalog``."""
        return self.root / "catalog"

    @property
    def catalog_location(self) -> str | Path:
        """Where the catalog is: the shared catalog's URL, else :attr:`catalog_path`."""
        return self.catalog_url if self.catalog_url is not None else self.catalog_path

    def open_catalog(self, *, create: bool) -> Catalog:
        """Opens this data directory's catalog (the shared one when :attr:`catalog_url`).

        Raises:
            CatalogError: It does not exist (``create`` False) or cannot be opened;
                :class:`~hub.errors.CatalogUnavailable` when a shared one's engine cannot
                be reached.
            ConfigError: The data directory's own catalog was moved to a shared one
                (``strata-hub migrate``): name that with ``--catalog``.
        """
        catalog = Catalog(self.catalog_location, create=create)
        moved = catalog.migrated_to() if self.catalog_url is None else None
        if moved is not None:
            catalog.close()
            raise ConfigError(
                f"the catalog of data dir {self.root} was moved to {moved} (strata-hub "
                f"migrate): use --catalog {moved}"
            )
        return catalog

    @classmethod
    def open(
        cls, root: str | os.PathLike[str], *, create: bool, catalog: str | None = None
    ) -> DataDir:
        """Locates (and optionally creates) a data directory.

        Args:
            root: The data directory.
            create: Create ``root`` (and its parents) when missing.
            catalog: A shared catalog's URL (``postgresql://…``), or None (the embedded
                LMDB catalog in ``DATA_DIR/catalog``).

        Returns:
            The data directory.

        Raises:
            DataDirNotFound: ``root`` does not exist (and ``create`` is False) or is not
                a directory.
            UnsafeDirectory: another local user could change ``root`` (:func:`secure`).
            ConfigError: ``catalog`` is not a ``postgresql://`` URL.
            HubError: ``root`` cannot be created, or its modes cannot be tightened.
        """
        if catalog is not None and not is_shared_location(catalog):
            raise ConfigError(
                f"--catalog must be a postgresql:// URL, got {redact(catalog)!r} "
                "(leave it out for the data directory's own catalog)"
            )
        path = Path(root)
        if create:
            try:
                path.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
            except FileExistsError:
                raise DataDirNotFound(f"data dir {path} is not a directory") from None
            except OSError as exc:
                raise HubError(f"cannot create data dir {path}: {exc.strerror}") from exc
        if not path.exists():
            raise DataDirNotFound(f"data dir {path} does not exist")
        if not path.is_dir():
            raise DataDirNotFound(f"data dir {path} is not a directory")
        try:
            secure(path)
        except OSError as exc:
            raise HubError(f"cannot make data dir {path} owner-only: {exc.strerror}") from exc
        return cls(path, catalog)

    def blob_store(
        self, catalog: Catalog, blobs: str | None = None, *, endpoint_url: str | None = None
    ) -> BlobStore:
        """Opens the blob store this data directory's catalog uses, recording it once.

        Args:
            catalog: The data directory's open catalog.
            blobs: A path or ``s3://BUCKET/PREFIX``; None means the recorded store, else
                ``DATA_DIR/blobs``. A relative path is relative to the data directory.
            endpoint_url: The S3 endpoint URL, for ``s3://`` stores.

        Returns:
            The store.

        Raises:
            Conflict: ``blobs`` names another store than the one the catalog records.
            ConfigError: ``blobs`` is malformed.
            StorageError: The store cannot be opened.
            CatalogError: The catalog cannot be written.
        """
        recorded = catalog.blobs_location()
        wanted = blobs if blobs is not None else (recorded or DEFAULT_BLOBS)
        if catalog.shared and blobs is not None and "://" not in blobs and not os.path.isabs(blobs):
            raise ConfigError(
                f"--blobs {blobs!r} is relative: with a shared catalog every replica must name "
                "the same store, so give an absolute path on shared storage or s3://BUCKET/PREFIX"
            )
        if catalog.shared and recorded is None and blobs is None:
            raise ConfigError(
                f"the shared catalog {catalog.location} records no blob store yet: name it "
                "with --blobs (an absolute path on storage every replica reaches, or "
                "s3://BUCKET/PREFIX) the first time; later commands find it recorded"
            )
        store = open_blob_store(self._resolve(wanted), endpoint_url=endpoint_url)
        if recorded is None:
            catalog.set_blobs_location(wanted if blobs is None else store.location)
        elif blobs is not None:
            known = open_blob_store(self._resolve(recorded), endpoint_url=endpoint_url)
            if known.location != store.location:
                owner = f"catalog {catalog.location}" if catalog.shared else f"data dir {self.root}"
                raise Conflict(
                    f"{owner} keeps its blocks in {known.location}, not {store.location}"
                )
        return store

    def _resolve(self, location: str) -> str:
        if "://" in location or os.path.isabs(location):
            return location
        return str(self.root / location)
