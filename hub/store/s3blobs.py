"""Blocks in S3-compatible object storage: :class:`S3BlobStore`, the
:class:`~hub.store.blobstore.BlobStore` whose blobs are objects (``s3://BUCKET/PREFIX/<first 2
hex>/<digest>``), through fsspec/s3fs (``put`` = PUT, ``read`` = ranged GET, ``delete`` =
DeleteObjects; S3 is strongly read-after-write consistent,
https://aws.amazon.com/s3/consistency/). Imported only when a store is on S3
(:func:`hub.store.blobstore.open_blob_store`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from hub.errors import BlockNotFound, ConfigError, CorruptBlob, StorageError
from hub.snapshot.blocks import block_digest
from hub.snapshot.names import DIGEST_PATTERN, note_name, validate_digest

S3_SCHEME = "s3://"


class S3BlobStore:
    """A :class:`BlobStore` in S3-compatible object storage, through fsspec/s3fs.

    Each blob is one object, ``s3://BUCKET/PREFIX/<first 2 hex>/<digest>``. An object PUT
    is atomic (an object is whole or absent), so there are no temporary objects, and a
    successful PUT is durable, so :meth:`sync` has nothing to do. Credentials come from
    the usual AWS sources (environment, shared config, instance role), as botocore finds
    them.

    Args:
        url: ``s3://BUCKET`` or ``s3://BUCKET/PREFIX``.
        endpoint_url: The object store's endpoint (e.g. ``http://127.0.0.1:9000`` for a
            MinIO or moto server); None uses AWS's (or ``$AWS_ENDPOINT_URL``).

    Raises:
        ConfigError: ``url`` is not an ``s3://`` URL with a bucket.
    """

    def __init__(self, url: str, *, endpoint_url: str | None = None) -> None:
        import s3fs  # type: ignore[import-untyped]  # imported only when S3 is used

        if not url.startswith(S3_SCHEME):
            raise ConfigError(f"not an s3:// URL: {url!r}")
        path = url[len(S3_SCHEME) :].rstrip("/")
        if not path or any(part in ("", ".", "..") for part in path.split("/")):
            raise ConfigError(f"invalid blob store URL {url!r}: expected s3://BUCKET[/PREFIX]")
        self._url = S3_SCHEME + path
        self._root = path
        client_kwargs: dict[str, Any] = {}
        if endpoint_url is not None:
            client_kwargs["endpoint_url"] = endpoint_url
        # No instance or listing caches: another process may add or delete blobs.
        self._fs = s3fs.S3FileSystem(
            client_kwargs=client_kwargs, skip_instance_cache=True, use_listings_cache=False
        )

    def _key(self, digest: str) -> str:
        validate_digest(digest)
        return f"{self._root}/{digest[:2]}/{digest}"

    def exists(self, digest: str) -> bool:
        """See :meth:`BlobStore.exists` (a HEAD request)."""
        key = self._key(digest)
        try:
            return bool(self._fs.exists(key))
        except Exception as exc:
            raise StorageError(f"cannot reach blob store {self._url}: {exc}") from exc

    def put(self, digest: str, data: bytes) -> bool:
        """See :meth:`BlobStore.put` (HEAD, then PUT when absent)."""
        if self.exists(digest):
            return False
        if block_digest(data) != digest:
            raise CorruptBlob(f"block bytes do not match digest {digest}")
        try:
            self._fs.pipe_file(self._key(digest), data)
        except Exception as exc:
            raise StorageError(f"cannot store block {digest} in {self._url}: {exc}") from exc
        return True

    def size(self, digest: str) -> int:
        """See :meth:`BlobStore.size` (a HEAD request)."""
        key = self._key(digest)
        try:
            return int(self._fs.info(key)["size"])
        except FileNotFoundError:
            raise BlockNotFound(f"unknown block {digest}") from None
        except Exception as exc:
            raise StorageError(f"cannot reach blob store {self._url}: {exc}") from exc

    def read(self, digest: str, offset: int = 0, length: int | None = None) -> bytes:
        """See :meth:`BlobStore.read` (a ranged GET)."""
        if offset < 0 or (length is not None and length < 0):
            raise ValueError(f"invalid range: offset {offset}, length {length}")
        key = self._key(digest)
        if length == 0:
            return b""
        end = None if length is None else offset + length
        try:
            data: bytes = self._fs.cat_file(key, start=offset, end=end)
        except FileNotFoundError:
            raise BlockNotFound(f"unknown block {digest}") from None
        except Exception as exc:
            raise StorageError(f"cannot read block {digest} from {self._url}: {exc}") from exc
        return data

    def sync(self) -> None:
        """See :meth:`BlobStore.sync`: nothing to do, a successful PUT is durable."""

    @property
    def location(self) -> str:
        """See :attr:`BlobStore.location`: the ``s3://`` URL."""
        return self._url

    def iter_digests(self) -> Iterator[str]:
        """See :meth:`BlobStore.iter_digests` (ListObjectsV2 under the prefix)."""
        try:
            keys = self._fs.find(self._root)
        except Exception as exc:
            raise StorageError(f"cannot list blob store {self._url}: {exc}") from exc
        for key in keys:
            name = key.rpartition("/")[2]
            if DIGEST_PATTERN.fullmatch(name):
                yield name

    def delete(self, digests: Sequence[str]) -> None:
        """See :meth:`BlobStore.delete` (DeleteObjects, up to 1000 keys per request)."""
        keys = [self._key(digest) for digest in digests]
        if not keys:
            return
        try:
            self._fs.rm(keys)
        except FileNotFoundError:
            pass
        except Exception as exc:
            raise StorageError(f"cannot delete blocks from {self._url}: {exc}") from exc

    def clean_temp(self, older_than_s: float) -> int:
        """See :meth:`BlobStore.clean_temp`: an object store keeps no partial objects."""
        return 0

    def read_note(self, name: str) -> bytes | None:
        """See :meth:`BlobStore.read_note`: the object ``PREFIX/NAME`` (a GET)."""
        try:
            data: bytes = self._fs.cat_file(f"{self._root}/{note_name(name)}")
        except FileNotFoundError:
            return None
        except Exception as exc:
            raise StorageError(f"cannot read {name} from {self._url}: {exc}") from exc
        return data

    def write_note(self, name: str, data: bytes) -> None:
        """See :meth:`BlobStore.write_note` (one PUT: an object appears whole)."""
        try:
            self._fs.pipe_file(f"{self._root}/{note_name(name)}", data)
        except Exception as exc:
            raise StorageError(f"cannot write {name} to {self._url}: {exc}") from exc
