"""Which live snapshots stored here hold a block: what a peer may be served.

Two records, both written only by the daemon (through :class:`spoke.catalog.catalog.
SnapshotCatalog`, the one writer of the index; ``DESIGN.md`` "One writer"):

- **blocks** (LMDB database ``blockscope``, sorted duplicates): block digest (16 raw
  bytes) → one value per stored manifest holding it, ``snapshot id (16 raw bytes) | size
  (u32)``. Written in the transactions that store the manifest (or, for a manifest stored
  before this index existed, when the catalog next loads it), never rewritten: manifests
  are immutable and stay stored. The index is on disk (memory-mapped), so a dataset of
  millions of blocks costs no resident memory here; writing it adds about 30 ms to storing
  a 16,384-block manifest (57 → 85 ms, once per manifest).
- **names** (database ``catalog``, keys ``scope/<snapshot id>/<dataset>\\0<version>``): the
  live versions each stored snapshot id was loaded as. Added whenever the catalog hands out
  a manifest for a version; removed when the hub revokes that version. Small (one per
  stored version), so also kept in memory.

A block may be served to a grant covering dataset D when some snapshot holding it is live
here as a version of D (:meth:`BlockScope.lookup`). Retention drops blocks, not manifests:
a snapshot nobody read for a while is still live, and a peer that asks for one of its
blocks makes this spoke fetch it again (under the same check).
"""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import lmdb

from protocol.hub.v1 import hub_pb2

_VALUE = struct.Struct(">16sI")  # snapshot id, block size
_NAMES = b"scope/"
_INDEXED = b"scope-indexed/"


@dataclass(frozen=True)
class Held:
    """What the index knows of one block: its size (bytes) and the datasets of the live
    snapshots stored here that hold it."""

    size: int
    datasets: frozenset[str]


class BlockScope:
    """The block → live stored snapshots index.

    Args:
        env: the daemon's LMDB environment.
        catalog_db: its ``catalog`` database (where the names live).
    """

    def __init__(self, env: lmdb.Environment, catalog_db: lmdb._Database) -> None:
        self._env = env
        self._catalog = catalog_db
        self._db = env.open_db(b"blockscope", dupsort=True)
        self._names: dict[str, set[tuple[str, str]]] = {}
        with env.begin(db=catalog_db) as txn:
            cursor = txn.cursor()
            if cursor.set_range(_NAMES):
                for key, _ in cursor:
                    if not key.startswith(_NAMES):
                        break
                    sid, _, name = key[len(_NAMES) :].decode().partition("/")
                    dataset, _, version = name.partition("\0")
                    self._names.setdefault(sid, set()).add((dataset, version))

    # -- writes (the daemon's loop only) ---------------------------------------------------

    def index(
        self,
        txn: lmdb.Transaction,
        snapshot_id: str,
        entries: Iterable[hub_pb2.ManifestEntry],
        complete: bool = True,
    ) -> None:
        """Record every block of ``entries``, a manifest being stored (or, with
        ``complete`` False, a part of it: the last part marks it indexed), inside its
        write transaction."""
        sid = bytes.fromhex(snapshot_id)
        for entry in entries:
            for block in entry.blocks:
                value = _VALUE.pack(sid, block.size)
                txn.put(bytes.fromhex(block.digest), value, db=self._db, dupdata=True)
        if complete:
            txn.put(_INDEXED + snapshot_id.encode(), b"", db=self._catalog)

    def is_indexed(self, snapshot_id: str) -> bool:
        """Whether the blocks of a stored manifest are in the index."""
        with self._env.begin(db=self._catalog) as txn:
            return txn.get(_INDEXED + snapshot_id.encode()) is not None

    def add_name(self, snapshot_id: str, dataset: str, version: str) -> None:
        """``snapshot_id`` is live here as ``dataset`` ``version`` (a no-op when known)."""
        names = self._names.setdefault(snapshot_id, set())
        if (dataset, version) in names:
            return
        with self._env.begin(write=True, db=self._catalog) as txn:
            txn.put(_key(snapshot_id, dataset, version), b"")
        names.add((dataset, version))

    def remove_name(self, snapshot_id: str, dataset: str, version: str) -> None:
        """``dataset`` ``version`` was revoked: its snapshot no longer serves as it."""
        with self._env.begin(write=True, db=self._catalog) as txn:
            txn.delete(_key(snapshot_id, dataset, version))
        names = self._names.get(snapshot_id)
        if names is not None:
            names.discard((dataset, version))
            if not names:
                del self._names[snapshot_id]

    # -- reads -----------------------------------------------------------------------------

    def names(self, snapshot_id: str) -> frozenset[tuple[str, str]]:
        """The live ``(dataset, version)`` names of a stored snapshot."""
        return frozenset(self._names.get(snapshot_id, ()))

    def _holders(self, txn: lmdb.Transaction, digest: str) -> list[tuple[str, int]]:
        cursor = txn.cursor(db=self._db)
        if not cursor.set_key(bytes.fromhex(digest)):
            return []
        out = []
        for value in cursor.iternext_dup():
            sid, size = _VALUE.unpack(value)
            out.append((sid.hex(), size))
        return out

    def lookup(self, digests: Sequence[str]) -> dict[str, Held]:
        """The digests this spoke holds in a live stored snapshot (others are left out).

        Args:
            digests: well-formed block digests (32 hex characters).
        """
        out: dict[str, Held] = {}
        with self._env.begin() as txn:
            for digest in digests:
                holders = self._holders(txn, digest)
                datasets = frozenset(
                    dataset for sid, _ in holders for dataset, _ in self._names.get(sid, ())
                )
                if datasets:
                    out[digest] = Held(holders[0][1], datasets)
        return out

    def datasets_of(self, digests: Sequence[str]) -> dict[str, frozenset[str]]:
        """The datasets of the live stored snapshots holding each of ``digests`` (digests
        none holds are left out): whose a block is, for tenants' shares
        (:mod:`spoke.cache.tenants`)."""
        return {digest: held.datasets for digest, held in self.lookup(digests).items()}

    def snapshots_of(self, digests: Sequence[str], most: int = 8) -> list[tuple[str, str, str]]:
        """``(dataset, version, snapshot id)`` of the live stored snapshots holding the most
        of ``digests``, at most ``most`` of them (the hint a peer request carries)."""
        votes: Counter[tuple[str, str, str]] = Counter()
        with self._env.begin() as txn:
            for digest in digests:
                for sid, _ in self._holders(txn, digest):
                    for dataset, version in self._names.get(sid, ()):
                        votes[(dataset, version, sid)] += 1
        return [name for name, _ in votes.most_common(most)]


def _key(snapshot_id: str, dataset: str, version: str) -> bytes:
    return f"{_NAMES.decode()}{snapshot_id}/{dataset}\0{version}".encode()
