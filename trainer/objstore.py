"""A Zarr store URL read through obstore (zarr's ``ObjectStore``) instead of fsspec.

``strata-train load --client obstore`` reads an ``s3://`` (``gs://``, ``az://``...) store
through :class:`zarr.storage.ObjectStore` over obstore, the Python binding of Rust's
``object_store`` crate — the other direct path a team streaming MDIO/Zarr from its bucket
picks (issue 41). obstore reads its configuration from the environment as the object
store's own clients do (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL``...: obstore's ``S3Config``), so the same
environment that points s3fs at a bucket points obstore there; ``--storage-option
KEY=VALUE`` flags become obstore config keys (``skip_signature=true``,
``endpoint=http://...``), not s3fs ones. An ``http://`` endpoint is allowed (obstore
refuses plain HTTP unless told).

Concurrency: zarr issues a read's chunk requests concurrently, at most
``async.concurrency`` at a time (zarr's performance guide; ``ZARR_ASYNC_CONCURRENCY`` in
the environment). obstore multiplexes them over its own connection pool.
"""

from __future__ import annotations

import os
from typing import Any

from zarr.abc.store import Store
from zarr.storage import FsspecStore, LocalStore

from trainer.location import StorageOptions, is_url

CLIENTS = ("fsspec", "obstore")
"""How a store URL is read: fsspec (s3fs for ``s3://``) or obstore."""


def open_objectstore(url: str, storage_options: StorageOptions | None = None) -> Store:
    """A read-only zarr store over obstore for a store URL.

    Args:
        url: The store's URL, e.g. ``s3://bucket/f3.mdio`` (bucket and prefix).
        storage_options: obstore config keys (``S3Config``...), added to what obstore
            reads from the environment.

    Returns:
        A :class:`zarr.storage.ObjectStore`, read-only.

    Raises:
        DataError: obstore is not installed, or refuses the URL or an option.
    """
    from trainer.volume import DataError

    try:
        import obstore.store
        from zarr.storage import ObjectStore
    except ImportError as exc:  # pragma: no cover - obstore is in the train extra
        raise DataError(f"--client obstore needs obstore (pip install obstore): {exc}") from exc
    config: Any = dict(storage_options or {})
    endpoint = str(config.get("endpoint") or os.environ.get("AWS_ENDPOINT_URL") or "")
    client_options: Any = {"allow_http": True} if endpoint.startswith("http://") else None
    try:
        inner = obstore.store.from_url(url, config=config or None, client_options=client_options)
    except Exception as exc:  # obstore's own error types for a bad URL or option
        raise DataError(f"cannot open {url} with obstore: {type(exc).__name__}: {exc}") from exc
    return ObjectStore(inner, read_only=True)


def raw_store(path: str, storage_options: StorageOptions, client: str = "fsspec") -> Store:
    """The zarr store under a data path, read-only: a local directory, or a URL through
    fsspec or (``client="obstore"``) :func:`open_objectstore`.

    Raises:
        DataError: obstore refuses the URL (``client="obstore"``).
    """
    if is_url(path) and client == "obstore":
        return open_objectstore(path, storage_options)
    if is_url(path):
        return FsspecStore.from_url(path, storage_options=dict(storage_options), read_only=True)
    return LocalStore(path, read_only=True)
