"""Recompute a snapshot id from the manifest entries the hub streamed.

The snapshot id is the xxh3-128 digest of the snapshot's *canonical manifest* (format 1;
the hub's ``hub/manifest.py`` is the reference, restated here because the spoke never
imports the hub). All integers are big-endian:

- the header ``b"strata-manifest\\0" | format u16 (=1) | block_size u32``;
- then, for every entry in path order, ``length u64 | entry``, an entry being
  ``type u8 | mode u32 | size u64 | mtime_ns i64 | path_len u32 | path (UTF-8)
  | target_len u32 | target (UTF-8) | block_count u32 | block_count x (digest 16 bytes
  | size u32)``.

A manifest that does not hash to the id it was resolved as was changed on the way (or by
a broken hub) and is refused. What this protects and what it does not: ``spoke/DESIGN.md``,
"Trust model".
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

import xxhash

from protocol.hub.v1 import hub_pb2

FORMAT = 1
_HEADER = b"strata-manifest\0"
_FIXED = struct.Struct(">BIQqI")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_HEADER_TAIL = struct.Struct(">HI")


def encode_entry(entry: hub_pb2.ManifestEntry) -> bytes:
    """The canonical bytes of one manifest entry (format 1).

    Raises:
        ValueError: a field does not fit its canonical width, or a digest is not hex.
    """
    path = entry.path.encode("utf-8")
    target = entry.symlink_target.encode("utf-8")
    try:
        parts = [
            _FIXED.pack(entry.type, entry.mode, entry.size, entry.mtime_ns, len(path)),
            path,
            _U32.pack(len(target)),
            target,
            _U32.pack(len(entry.blocks)),
        ]
        for block in entry.blocks:
            raw = bytes.fromhex(block.digest)
            if len(raw) != 16:
                raise ValueError(f"block digest {block.digest!r} is not 16 bytes")
            parts += [raw, _U32.pack(block.size)]
    except struct.error as err:
        raise ValueError(f"{entry.path!r}: {err}") from None
    return b"".join(parts)


def snapshot_id(block_size: int, entries: Iterable[hub_pb2.ManifestEntry]) -> str:
    """The snapshot id of ``entries`` (32 lowercase hex characters).

    Raises:
        ValueError: entries out of path order, repeated, or with fields out of range.
    """
    digest = xxhash.xxh3_128()
    digest.update(_HEADER + _HEADER_TAIL.pack(FORMAT, block_size))
    last: str | None = None
    for entry in entries:
        if last is not None and entry.path <= last:
            raise ValueError(f"manifest entries out of path order at {entry.path!r}")
        last = entry.path
        encoded = encode_entry(entry)
        digest.update(_U64.pack(len(encoded)))
        digest.update(encoded)
    return digest.hexdigest()
