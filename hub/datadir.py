"""The layout of a hub's data directory.

```
DATA_DIR/
  catalog/   LMDB environment: datasets, versions, tags, snapshots, manifests (hub.catalog)
  blobs/     content-addressed block files, blobs/<first 2 hex>/<digest> (hub.blobstore)
```
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from hub.errors import DataDirNotFound, HubError


@dataclass(frozen=True, slots=True)
class DataDir:
    """A hub data directory.

    Attributes:
        root: The directory itself.
    """

    root: Path

    @property
    def catalog_path(self) -> Path:
        """The LMDB environment directory, ``DATA_DIR/catalog``."""
        return self.root / "catalog"

    @property
    def blobs_path(self) -> Path:
        """The blob store directory, ``DATA_DIR/blobs``."""
        return self.root / "blobs"

    @classmethod
    def open(cls, root: str | os.PathLike[str], *, create: bool) -> DataDir:
        """Locates (and optionally creates) a data directory.

        Args:
            root: The data directory.
            create: Create ``root`` (and its parents) when missing.

        Returns:
            The data directory.

        Raises:
            DataDirNotFound: ``root`` does not exist (and ``create`` is False) or is not
                a directory.
            HubError: ``root`` cannot be created.
        """
        path = Path(root)
        if create:
            try:
                path.mkdir(parents=True, exist_ok=True)
            except FileExistsError:
                raise DataDirNotFound(f"data dir {path} is not a directory") from None
            except OSError as exc:
                raise HubError(f"cannot create data dir {path}: {exc.strerror}") from exc
        if not path.exists():
            raise DataDirNotFound(f"data dir {path} does not exist")
        if not path.is_dir():
            raise DataDirNotFound(f"data dir {path} is not a directory")
        return cls(path)
