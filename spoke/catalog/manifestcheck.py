"""Recompute a snapshot id from the manifest entries the hub streamed.

The snapshot id is the xxh3-128 digest of the snapshot's *canonical manifest* (format 1;
the hub's ``hub/snapshot/manifest.py`` is the reference, restated here because the spoke never
imports the hub). All integers are big-endian:

- the header ``b"strata-manifest\\0" | format u16 (=1) | block_size u32``;
- then, for every entry in path order, ``length u64 | entry``, an entry being
  ``type u8 | mode u32 | size u64 | mtime_ns i64 | path_len u32 | path (UTF-8)
  | target_len u32 | target (UTF-8) | block_count u32 | block_count x (digest 16 bytes
  | size u32)``.

A manifest that does not hash to the id it was resolved as was changed on the way (or by
a broken hub) and is refused; so is one that hashes right but is no tree the hub would
publish (:func:`check_tree`: ``..``, empty components, NUL, a name twice, a file's
children), which a hub not trusted for content could send with a recomputed id. What
this protects and what it does not: ``spoke/DESIGN.md``, "Trust model".
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Iterable, Sequence

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


MAX_PATH_BYTES = 4095
"""Longest manifest path, UTF-8 bytes (Linux ``PATH_MAX`` less the NUL;
``hub.snapshot.manifest``)."""

MAX_NAME_BYTES = 255
"""Longest path component, UTF-8 bytes (Linux ``NAME_MAX``)."""

_TYPES = (hub_pb2.ENTRY_TYPE_FILE, hub_pb2.ENTRY_TYPE_DIRECTORY, hub_pb2.ENTRY_TYPE_SYMLINK)


def check_tree(entries: Sequence[hub_pb2.ManifestEntry]) -> None:
    """Refuse a manifest that is no tree the mount can show, whatever its snapshot id.

    A hub not trusted for content (no ``--publisher-key``; a proxy that recomputes the id)
    could otherwise send paths the hub never publishes (``hub.snapshot.manifest.validate_path``):
    each entry's path must be relative, its components neither empty, ``.`` nor ``..``,
    without NUL, at most :data:`MAX_NAME_BYTES` each and :data:`MAX_PATH_BYTES` in all;
    paths strictly in path order (so no name twice); a known type; a symlink's target
    non-empty and without NUL; and an entry's parent, when listed, a directory (nothing
    is put inside a file or a symlink).

    Args:
        entries: the manifest, in the order the hub sent it.

    Raises:
        ValueError: the first entry that breaks a rule, named (one line).
    """
    dirs: set[str] = set()
    last: str | None = None
    for i, entry in enumerate(entries):
        path = entry.path
        shown = repr(path if len(path) <= 80 else path[:77] + "...")
        if not path or path.startswith("/") or "\0" in path:
            raise ValueError(f"invalid path {shown}: empty, absolute or with NUL")
        if len(path.encode("utf-8")) > MAX_PATH_BYTES:
            raise ValueError(f"invalid path {shown}: over {MAX_PATH_BYTES} bytes")
        parts = path.split("/")
        for part in parts:
            if part in ("", ".", ".."):
                raise ValueError(f"invalid path {shown}: an empty, '.' or '..' component")
            if len(part.encode("utf-8")) > MAX_NAME_BYTES:
                raise ValueError(f"invalid path {shown}: a component over {MAX_NAME_BYTES} bytes")
        if last is not None and path <= last:
            raise ValueError(f"entry {shown} is out of path order or repeated")
        last = path
        if entry.type not in _TYPES:
            raise ValueError(f"entry {shown} has unknown type {entry.type}")
        if entry.type == hub_pb2.ENTRY_TYPE_SYMLINK and (
            not entry.symlink_target or "\0" in entry.symlink_target
        ):
            raise ValueError(f"symlink {shown} has an empty target or one with NUL")
        parent = path.rpartition("/")[0]
        if parent and parent not in dirs:
            # listed before it (path order) as something else, or not listed (implicit)
            j = bisect.bisect_left(entries, parent, 0, i, key=lambda e: e.path)
            if j < i and entries[j].path == parent:
                raise ValueError(f"entry {shown} is inside {parent!r}, which is no directory")
        if entry.type == hub_pb2.ENTRY_TYPE_DIRECTORY:
            dirs.add(path)
