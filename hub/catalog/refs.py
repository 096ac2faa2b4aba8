"""Block references: which blocks live versions use, per dataset, and what is garbage.

``blocks`` counts, per digest, its occurrences in the manifests of live versions and
``block_refs`` splits the count by dataset; ``pending`` holds the protections of
publishes in flight (see :mod:`hub.catalog`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import lmdb

from hub.catalog.base import CatalogBase
from hub.catalog.schema import BLOCK, META_BLOCK_BYTES, U64, add_count, iter_prefix
from hub.catalog.txn import CatalogTxn
from hub.errors import CorruptCatalog
from hub.snapshot.manifest import decode_block_refs
from hub.snapshot.names import validate_digest


def count_blocks(
    txn: CatalogTxn,
    manifest: int,
    dataset: str,
    delta: int,
    unprotect: int | None = None,
) -> None:
    """Adds ``delta`` to the references of every block occurrence in a manifest.

    With ``unprotect``, also removes that publish's protection of each block.

    Raises:
        CorruptCatalog: A count would drop below zero.
    """
    blocks, refs, pending = txn.db[b"blocks"], txn.db[b"block_refs"], txn.db[b"pending"]
    suffix = U64.pack(unprotect) if unprotect is not None else None
    name = dataset.encode("utf-8")
    byte_delta = 0
    prefix = U64.pack(manifest)
    for _, value in iter_prefix(txn.cursor(db=txn.db[b"manifests"]), prefix):
        for raw, size in decode_block_refs(value):
            record = txn.get(raw, db=blocks)
            count = (BLOCK.unpack(record)[0] if record is not None else 0) + delta
            if count < 0:
                raise CorruptCatalog(f"reference count of block {raw.hex()} below zero")
            if count == 0:
                txn.delete(raw, db=blocks)
                byte_delta -= size
            else:
                if record is None:
                    byte_delta += size
                txn.put(raw, BLOCK.pack(count, size), db=blocks)
            add_count(txn.txn, refs, raw + name, delta)
            if suffix is not None:
                txn.delete(raw + suffix, db=pending)
    if byte_delta:
        txn.add_meta(META_BLOCK_BYTES, byte_delta)


class RefsMixin(CatalogBase):
    """The block-reference methods of :class:`~hub.catalog.Catalog`."""

    def block_size(self, digest: str, readable: Callable[[str], bool] | None = None) -> int | None:
        """Tells whether a block belongs to a live version the caller may read.

        Args:
            digest: The block's digest.
            readable: Tells whether the caller may read a dataset; None means every
                dataset.

        Returns:
            The block's length in bytes, or None when no live version of a readable
            dataset references it (unknown, revoked, or another dataset's block).

        Raises:
            InvalidDigest: ``digest`` is malformed.
        """
        raw = bytes.fromhex(validate_digest(digest))
        with self.read() as txn:
            record = txn.get(raw, db=self._db[b"blocks"])
            if record is None:
                return None
            if readable is not None:
                refs = txn.cursor(db=self._db[b"block_refs"])
                if not any(readable(key[16:].decode("utf-8")) for key, _ in iter_prefix(refs, raw)):
                    return None
            size: int = BLOCK.unpack(record)[1]
            return size

    def is_live_or_pending(self, txn: CatalogTxn | lmdb.Transaction[bytes], digest: str) -> bool:
        """Tells, inside a caller's transaction, whether a block must be kept.

        Args:
            txn: A transaction on this catalog's environment.
            digest: The block's digest.

        Returns:
            True when a live version references the block or a publish protected it.
        """
        raw = bytes.fromhex(digest)
        if txn.get(raw, db=self._db[b"blocks"]) is not None:
            return True
        cursor = txn.cursor(db=self._db[b"pending"])
        return cursor.set_range(raw) and cursor.key().startswith(raw)

    def delete_unreferenced(
        self, digests: Sequence[str], delete: Callable[[list[str]], None]
    ) -> list[str]:
        """Deletes the blocks among ``digests`` that nothing references, under the writer lock.

        The check and ``delete`` run inside one LMDB write transaction, so no publish can
        protect (and then rely on) one of these blocks between the check and the deletion:
        a publish protects a digest in a write transaction before it stores the block.

        Args:
            digests: Candidate digests (e.g. one listing page of the blob store).
            delete: Deletes blobs from the store; called once with the garbage, if any.

        Returns:
            The digests deleted.

        Raises:
            CatalogError: The catalog cannot be locked.
        """
        with self.write() as txn:
            garbage = [digest for digest in digests if not self.is_live_or_pending(txn, digest)]
            if garbage:
                delete(garbage)
            return garbage
