"""Manifest entries, their canonical serialization, and snapshot ids.

A manifest is a snapshot's file tree: one :class:`ManifestEntry` per file, directory
and symlink below the snapshot root, in *path order* — ascending by the path's UTF-8
bytes, which is also Python's ``str`` order, so a directory always precedes its
contents.

Canonical serialization (format 1), all integers big-endian:

- an entry: ``type u8 | mode u32 | size u64 | mtime_ns i64 | path_len u32 | path (UTF-8)
  | target_len u32 | target (UTF-8) | block_count u32 | block_count x (digest 16 bytes
  | size u32)``, the digest being the raw 16 bytes of the xxh3-128 hex digest;
- the canonical manifest: the header ``b"strata-manifest\\0" | format u16 | block_size u32``
  followed, for every entry in path order, by ``length u64 | entry``.

The snapshot id is the xxh3-128 digest (32 lowercase hex characters; xxHash spec,
https://github.com/Cyan4973/xxHash/blob/dev/doc/xxhash_spec.md) of the canonical
manifest, so identical trees published with the same block size share one id and any
change of a byte, a name, a mode or an mtime gives a new one.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable
from dataclasses import dataclass

import xxhash

from hub.errors import CorruptCatalog, InvalidArgument, InvalidName
from hub.snapshot.blocks import BlockRef, validate_block_size
from hub.snapshot.names import validate_digest

FORMAT = 1
"""Version of the canonical manifest serialization."""

HEADER_MAGIC = b"strata-manifest\0"

_FIXED = struct.Struct(">BIQqI")  # type, mode, size, mtime_ns, path_len
_LENGTH = struct.Struct(">I")
_BLOCK_SIZE = struct.Struct(">I")
_ENTRY_LENGTH = struct.Struct(">Q")
_HEADER = struct.Struct(">HI")  # format, block_size
_MAX_U32 = 2**32 - 1
_MAX_U64 = 2**64 - 1

MAX_PATH_BYTES = 4095
"""Longest manifest path, UTF-8 bytes (Linux ``PATH_MAX`` less the terminating NUL)."""

MAX_NAME_BYTES = 255
"""Longest path component, UTF-8 bytes (Linux ``NAME_MAX``)."""


class EntryType(enum.IntEnum):
    """Kind of a manifest entry; the values are those of ``protocol.hub.v1.EntryType``."""

    FILE = 1
    DIRECTORY = 2
    SYMLINK = 3


def validate_path(path: str) -> str:
    """Checks a manifest path.

    Args:
        path: A POSIX path relative to the snapshot root, e.g. ``"a/b.bin"``.

    Returns:
        ``path``, unchanged.

    Raises:
        InvalidName: The path is empty, absolute, has an empty, ``.`` or ``..`` component,
            contains NUL, is not encodable as UTF-8, or is longer than
            :data:`MAX_PATH_BYTES` (or a component longer than :data:`MAX_NAME_BYTES`).
    """
    shown = repr(path if len(path) <= 80 else path[:77] + "...")
    if not path or path.startswith("/") or "\0" in path:
        raise InvalidName(f"invalid manifest path {shown}")
    try:
        encoded = path.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidName(f"invalid manifest path {shown}: not valid UTF-8") from None
    if len(encoded) > MAX_PATH_BYTES:
        raise InvalidName(
            f"invalid manifest path {shown}: {len(encoded)} bytes, over {MAX_PATH_BYTES}"
        )
    for part in path.split("/"):
        if part in ("", ".", ".."):
            raise InvalidName(f"invalid manifest path {shown}: empty, '.' or '..' component")
        if len(part.encode("utf-8")) > MAX_NAME_BYTES:
            raise InvalidName(
                f"invalid manifest path {shown}: a component is over {MAX_NAME_BYTES} bytes"
            )
    return path


@dataclass(frozen=True, slots=True)
class ManifestEntry:
    """One file, directory or symlink of a snapshot.

    Attributes:
        path: POSIX path relative to the snapshot root, ``/``-separated, no leading ``/``.
        type: File, directory or symlink.
        mode: Permission bits, ``st_mode & 0o7777``.
        size: Bytes: the file's length, 0 for a directory, the target's UTF-8 length for
            a symlink.
        mtime_ns: Modification time, nanoseconds since the Unix epoch.
        symlink_target: The symlink's target (symlinks only; empty otherwise).
        blocks: The file's blocks in file order (files only); their sizes sum to ``size``.

    Raises:
        InvalidName: ``path`` is not a valid manifest path.
        InvalidDigest: A block digest is malformed.
        ValueError: The fields contradict each other (e.g. blocks on a directory).
    """

    path: str
    type: EntryType
    mode: int
    size: int
    mtime_ns: int
    symlink_target: str = ""
    blocks: tuple[BlockRef, ...] = ()

    def __post_init__(self) -> None:
        validate_path(self.path)
        if not 0 <= self.mode <= 0o7777:
            raise ValueError(f"{self.path}: mode {self.mode:#o} has bits beyond 0o7777")
        if not 0 <= self.size <= _MAX_U64:
            raise ValueError(f"{self.path}: size {self.size} out of range")
        if not -(2**63) <= self.mtime_ns < 2**63:
            raise ValueError(f"{self.path}: mtime_ns {self.mtime_ns} out of range")
        if self.type == EntryType.FILE:
            if self.symlink_target:
                raise ValueError(f"{self.path}: a file has no symlink target")
            if sum(block.size for block in self.blocks) != self.size:
                raise ValueError(f"{self.path}: block sizes do not add up to {self.size}")
            for block in self.blocks:
                validate_digest(block.digest)
                if not 1 <= block.size <= _MAX_U32:
                    raise ValueError(f"{self.path}: block size {block.size} out of range")
        elif self.type == EntryType.DIRECTORY:
            if self.size or self.symlink_target or self.blocks:
                raise ValueError(f"{self.path}: a directory has no size, target or blocks")
        elif self.type == EntryType.SYMLINK:
            if self.blocks or not self.symlink_target:
                raise ValueError(f"{self.path}: a symlink has a target and no blocks")
            if self.size != len(self.symlink_target.encode("utf-8")):
                raise ValueError(f"{self.path}: symlink size is not its target's length")
        else:
            raise ValueError(f"{self.path}: unknown entry type {self.type!r}")


def encode_entry(entry: ManifestEntry) -> bytes:
    """Serializes an entry canonically (format 1, see the module docstring).

    Args:
        entry: The entry.

    Returns:
        The entry's canonical bytes; equal entries always give equal bytes.
    """
    path = entry.path.encode("utf-8")
    target = entry.symlink_target.encode("utf-8")
    parts = [
        _FIXED.pack(int(entry.type), entry.mode, entry.size, entry.mtime_ns, len(path)),
        path,
        _LENGTH.pack(len(target)),
        target,
        _LENGTH.pack(len(entry.blocks)),
    ]
    for block in entry.blocks:
        parts.append(bytes.fromhex(block.digest))
        parts.append(_BLOCK_SIZE.pack(block.size))
    return b"".join(parts)


def decode_entry(data: bytes) -> ManifestEntry:
    """Parses an entry written by :func:`encode_entry`.

    Args:
        data: The entry's canonical bytes.

    Returns:
        The entry.

    Raises:
        CorruptCatalog: ``data`` is truncated, has trailing bytes or invalid fields.
    """
    try:
        view = memoryview(data)
        kind, mode, size, mtime_ns, path_len = _FIXED.unpack_from(view, 0)
        offset = _FIXED.size
        path = bytes(view[offset : offset + path_len]).decode("utf-8")
        offset += path_len
        (target_len,) = _LENGTH.unpack_from(view, offset)
        offset += _LENGTH.size
        target = bytes(view[offset : offset + target_len]).decode("utf-8")
        offset += target_len
        (count,) = _LENGTH.unpack_from(view, offset)
        offset += _LENGTH.size
        blocks = []
        for _ in range(count):
            digest = bytes(view[offset : offset + 16])
            (block_len,) = _BLOCK_SIZE.unpack_from(view, offset + 16)
            if len(digest) != 16:
                raise ValueError("truncated block digest")
            blocks.append(BlockRef(digest.hex(), block_len))
            offset += 16 + _BLOCK_SIZE.size
        if offset != len(view) or len(path) == 0:
            raise ValueError("bad entry length")
        return ManifestEntry(path, EntryType(kind), mode, size, mtime_ns, target, tuple(blocks))
    except (struct.error, ValueError, UnicodeDecodeError, InvalidArgument) as exc:
        raise CorruptCatalog(f"corrupt manifest entry: {exc}") from exc


def decode_block_refs(data: bytes) -> list[tuple[bytes, int]]:
    """Reads only the block list of an entry written by :func:`encode_entry` (fast path).

    Args:
        data: The entry's canonical bytes.

    Returns:
        ``(raw 16-byte digest, block length in bytes)`` per block, in file order.

    Raises:
        CorruptCatalog: ``data`` is truncated.
    """
    try:
        path_len = _FIXED.unpack_from(data, 0)[4]
        offset = _FIXED.size + path_len
        (target_len,) = _LENGTH.unpack_from(data, offset)
        offset += _LENGTH.size + target_len
        (count,) = _LENGTH.unpack_from(data, offset)
        offset += _LENGTH.size
        if offset + count * (16 + _BLOCK_SIZE.size) != len(data):
            raise ValueError("bad entry length")
        refs = []
        for _ in range(count):
            refs.append((data[offset : offset + 16], _BLOCK_SIZE.unpack_from(data, offset + 16)[0]))
            offset += 16 + _BLOCK_SIZE.size
        return refs
    except (struct.error, ValueError) as exc:
        raise CorruptCatalog(f"corrupt manifest entry: {exc}") from exc


class ManifestHasher:
    """Computes a snapshot id incrementally, one entry at a time.

    Args:
        block_size: The snapshot's maximum block length, bytes.

    Raises:
        InvalidArgument: ``block_size`` is out of range.
    """

    def __init__(self, block_size: int) -> None:
        validate_block_size(block_size)
        self._hash = xxhash.xxh3_128()
        self._hash.update(HEADER_MAGIC + _HEADER.pack(FORMAT, block_size))
        self._last_path: str | None = None

    def add(self, entry: ManifestEntry) -> bytes:
        """Adds the next entry.

        Args:
            entry: An entry whose path sorts after every entry added so far.

        Returns:
            The entry's canonical bytes (so callers can store them without re-encoding).

        Raises:
            ValueError: The entry is out of path order or repeats a path.
        """
        encoded = encode_entry(entry)
        self.add_encoded(entry.path, encoded)
        return encoded

    def add_encoded(self, path: str, encoded: bytes) -> None:
        """Adds the next entry as stored: its path and its canonical bytes.

        Hashes ``encoded`` as it is, so re-hashing a stored manifest proves its stored
        bytes (:meth:`hub.catalog.Catalog.manifest_digest`), not a re-encoding of them.

        Args:
            path: The entry's path; it must sort after every path added so far.
            encoded: The entry's canonical bytes (:func:`encode_entry`).

        Raises:
            ValueError: ``path`` is out of path order or repeats a path.
        """
        if self._last_path is not None and path <= self._last_path:
            raise ValueError(f"manifest entries out of path order at {path!r}")
        self._last_path = path
        self._hash.update(_ENTRY_LENGTH.pack(len(encoded)))
        self._hash.update(encoded)

    def hexdigest(self) -> str:
        """The snapshot id of the entries added so far, 32 lowercase hex characters."""
        return self._hash.hexdigest()


def snapshot_id(block_size: int, entries: Iterable[ManifestEntry]) -> str:
    """Computes the snapshot id of a manifest.

    Args:
        block_size: The snapshot's maximum block length, bytes.
        entries: The entries in path order.

    Returns:
        xxh3-128 of the canonical manifest, 32 lowercase hex characters.

    Raises:
        ValueError: The entries are out of path order or repeat a path.
        InvalidArgument: ``block_size`` is out of range.
    """
    hasher = ManifestHasher(block_size)
    for entry in entries:
        hasher.add(entry)
    return hasher.hexdigest()
