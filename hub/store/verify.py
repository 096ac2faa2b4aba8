"""Proving a version is what was published.

A snapshot id is the xxh3-128 digest of the canonical manifest (:mod:`hub.snapshot.manifest`) and
every block is named by the xxh3-128 digest of its bytes, so a version can be checked
end to end: re-hash the stored manifest and compare it with the id recorded at publish
time, then (optionally) re-hash every block the manifest names. Any changed byte — in a
manifest entry or in a block — shows up as a mismatch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hub.catalog import Catalog, Snapshot
from hub.errors import BlockNotFound
from hub.snapshot.blocks import block_digest
from hub.store.blobstore import BlobStore


@dataclass(frozen=True, slots=True)
class VerifyResult:
    """The outcome of :func:`verify`.

    Attributes:
        snapshot: The version checked.
        manifest_digest: The snapshot id recomputed from the stored manifest.
        blocks_checked: Distinct blocks re-hashed (0 unless blocks were checked).
        missing: Digests of blocks the store does not hold.
        corrupt: Digests of blocks whose bytes do not hash to their name.
    """

    snapshot: Snapshot
    manifest_digest: str
    blocks_checked: int = 0
    missing: list[str] = field(default_factory=list)
    corrupt: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the manifest and every checked block are intact."""
        return (
            self.manifest_digest == self.snapshot.snapshot_id
            and not self.missing
            and not self.corrupt
        )


def verify(
    catalog: Catalog, store: BlobStore, dataset: str, ref: str, *, blocks: bool = False
) -> VerifyResult:
    """Checks a version's manifest against its snapshot id, and optionally its blocks.

    Args:
        catalog: The catalog.
        store: The blob store.
        dataset: The dataset's name.
        ref: A version or tag.
        blocks: Also read and re-hash every distinct block.

    Returns:
        What was found.

    Raises:
        InvalidName: ``dataset`` or ``ref`` is malformed.
        NotFound: No such dataset, version or tag (or the version was revoked).
        CorruptCatalog: A stored manifest entry cannot be decoded.
        StorageError: The blob store failed.
    """
    snapshot = catalog.resolve(dataset, ref)
    digest = catalog.manifest_digest(snapshot.snapshot_id)
    missing: list[str] = []
    corrupt: list[str] = []
    checked: set[str] = set()
    if blocks:
        for entry in catalog.iter_manifest(snapshot.snapshot_id):
            for block in entry.blocks:
                if block.digest in checked:
                    continue
                checked.add(block.digest)
                try:
                    data = store.read(block.digest)
                except BlockNotFound:
                    missing.append(block.digest)
                    continue
                if len(data) != block.size or block_digest(data) != block.digest:
                    corrupt.append(block.digest)
    return VerifyResult(snapshot, digest, len(checked), missing, corrupt)
