"""Pins: named sets of blocks kept out of eviction, persisted in the daemon's index."""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import asdict, dataclass, field, fields

import lmdb

from spoke.cache.blockcache import BlockCache
from spoke.catalog.selection import preview


@dataclass
class Pin:
    """One pin: the files of a snapshot it holds, and their blocks.

    Attributes:
        id: opaque identifier.
        dataset, ref, version: what was asked for and what it resolved to.
        paths: the first globs asked for (at most about 1 KiB of them:
            :func:`spoke.catalog.selection.preview`).
        bytes: distinct block bytes held, bytes.
        created: Unix time, seconds.
    """

    id: str
    dataset: str
    ref: str
    version: str
    paths: list[str]
    bytes: int
    created: float
    digests: list[str] = field(default_factory=list, repr=False)
    paths_total: int = 0
    """How many globs were asked for (a record of an older spoke: as many as it kept)."""

    def __post_init__(self) -> None:
        self.paths_total = self.paths_total or len(self.paths)
        self.paths = preview(self.paths)

    @property
    def blocks(self) -> int:
        """How many blocks the pin holds (its block list's length)."""
        return len(self.digests)

    def public(self) -> dict[str, object]:
        """The pin as the admin API shows it (without its block list, which is not copied:
        ``asdict`` deep-copied it, and a probe's ``GET /v1/pins`` took 31 s)."""
        out: dict[str, object] = {f.name: getattr(self, f.name) for f in fields(self)}
        out.pop("digests")
        out["paths"] = list(self.paths)
        out["blocks"] = self.blocks
        return out


class PinRegistry:
    """Pins by id; every change is written to LMDB before the cache is told.

    Args:
        env: the daemon's LMDB environment (database ``pins``).
        cache: whose blocks the pins hold; pins found in the index are re-applied at start.
    """

    def __init__(self, env: lmdb.Environment, cache: BlockCache) -> None:
        self._env = env
        self._db = env.open_db(b"pins")
        self._cache = cache
        self._pins: dict[str, Pin] = {}
        with env.begin(db=self._db) as txn:
            for key, value in txn.cursor():
                pin = Pin(**json.loads(value))
                self._pins[key.decode()] = pin
                cache.pin(pin.digests)

    def add(
        self, dataset: str, ref: str, version: str, paths: list[str], blocks: dict[str, int]
    ) -> Pin:
        """Create and persist a pin over ``blocks`` (digest → size)."""
        pin = Pin(
            secrets.token_hex(8),
            dataset,
            ref,
            version,
            paths,
            sum(blocks.values()),
            time.time(),
            list(blocks),
            len(paths),
        )
        with self._env.begin(write=True, db=self._db) as txn:
            txn.put(pin.id.encode(), json.dumps(asdict(pin)).encode())
        self._pins[pin.id] = pin
        self._cache.pin(pin.digests)
        return pin

    def remove(self, pin_id: str) -> Pin | None:
        """Delete a pin; its blocks become evictable unless another pin holds them."""
        pin = self._pins.pop(pin_id, None)
        if pin is None:
            return None
        with self._env.begin(write=True, db=self._db) as txn:
            txn.delete(pin_id.encode())
        self._cache.unpin(pin.digests)
        return pin

    def get(self, pin_id: str) -> Pin | None:
        """A pin by id."""
        return self._pins.get(pin_id)

    def all(self) -> list[Pin]:
        """Every pin, oldest first."""
        return sorted(self._pins.values(), key=lambda p: p.created)
