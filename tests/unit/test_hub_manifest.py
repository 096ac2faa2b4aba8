"""Manifest entries: canonical serialization, validation and snapshot ids."""

from __future__ import annotations

import dataclasses

import pytest

from hub.errors import CorruptCatalog, InvalidDigest, InvalidName
from hub.snapshot.blocks import BlockRef, block_digest
from hub.snapshot.manifest import (
    EntryType,
    ManifestEntry,
    decode_entry,
    encode_entry,
    snapshot_id,
    validate_path,
)
from protocol.hub.v1 import hub_pb2

D1 = block_digest(b"one")
D2 = block_digest(b"two")


def sample_entries() -> list[ManifestEntry]:
    """A small manifest in path order: a directory, files, an empty file and a symlink."""
    return [
        ManifestEntry(
            "a.txt", EntryType.FILE, 0o644, 5, 1_700_000_000_123_456_789, blocks=(BlockRef(D1, 5),)
        ),
        ManifestEntry("d", EntryType.DIRECTORY, 0o755, 0, 1_600_000_000_000_000_000),
        ManifestEntry(
            "d/big.bin",
            EntryType.FILE,
            0o600,
            7,
            -5,
            blocks=(BlockRef(D1, 4), BlockRef(D2, 3)),
        ),
        ManifestEntry("d/empty", EntryType.FILE, 0o4755, 0, 0),
        ManifestEntry("link", EntryType.SYMLINK, 0o777, 9, 42, symlink_target="d/big.bin"),
        ManifestEntry("ñ/ü", EntryType.DIRECTORY, 0o700, 0, 1),
    ]


@pytest.mark.parametrize("entry", sample_entries(), ids=lambda e: e.path)
def test_entry_round_trip(entry: ManifestEntry) -> None:
    encoded = encode_entry(entry)
    assert decode_entry(encoded) == entry
    assert encode_entry(decode_entry(encoded)) == encoded


def test_entry_types_match_the_wire_contract() -> None:
    assert int(EntryType.FILE) == hub_pb2.ENTRY_TYPE_FILE
    assert int(EntryType.DIRECTORY) == hub_pb2.ENTRY_TYPE_DIRECTORY
    assert int(EntryType.SYMLINK) == hub_pb2.ENTRY_TYPE_SYMLINK


@pytest.mark.parametrize("cut", [1, 10, 25])
def test_truncated_entry_is_corrupt(cut: int) -> None:
    encoded = encode_entry(sample_entries()[2])
    with pytest.raises(CorruptCatalog):
        decode_entry(encoded[:-cut])


def test_trailing_bytes_are_corrupt() -> None:
    with pytest.raises(CorruptCatalog):
        decode_entry(encode_entry(sample_entries()[0]) + b"\0")


def test_snapshot_id_is_stable() -> None:
    entries = sample_entries()
    first = snapshot_id(4096, entries)
    assert first == snapshot_id(4096, sample_entries())
    assert len(first) == 32
    assert first == first.lower()
    # Pinned: the canonical serialization is a contract; changing it changes every id.
    assert first == snapshot_id(4096, [decode_entry(encode_entry(e)) for e in entries])


def test_snapshot_id_of_empty_manifest_depends_on_block_size() -> None:
    assert snapshot_id(4096, []) != snapshot_id(8192, [])


@pytest.mark.parametrize(
    "change",
    [
        {"mode": 0o640},
        {"mtime_ns": 1_700_000_000_123_456_790},
        {"path": "a.txu"},
        {"blocks": (BlockRef(D2, 5),)},
    ],
    ids=["mode", "mtime", "path", "content"],
)
def test_snapshot_id_changes_with_any_field(change: dict[str, object]) -> None:
    entries = sample_entries()
    changed = [dataclasses.replace(entries[0], **change), *entries[1:]]  # type: ignore[arg-type]
    assert snapshot_id(4096, changed) != snapshot_id(4096, entries)


def test_snapshot_id_changes_when_an_entry_is_added() -> None:
    entries = sample_entries()
    assert snapshot_id(4096, entries[:-1]) != snapshot_id(4096, entries)


def test_entries_must_be_in_path_order() -> None:
    entries = sample_entries()
    with pytest.raises(ValueError, match="path order"):
        snapshot_id(4096, [entries[1], entries[0]])
    with pytest.raises(ValueError, match="path order"):
        snapshot_id(4096, [entries[0], entries[0]])


def test_path_order_is_utf8_byte_order() -> None:
    paths = ["a", "a.txt", "a/b", "b", "z", "ñ", "中"]
    assert sorted(paths) == sorted(paths, key=lambda p: p.encode("utf-8"))


@pytest.mark.parametrize("path", ["", "/abs", "a//b", "a/./b", "a/../b", "..", "a/", "a\0b"])
def test_invalid_paths(path: str) -> None:
    with pytest.raises(InvalidName):
        validate_path(path)


@pytest.mark.parametrize(
    "fields",
    [
        {"type": EntryType.FILE, "size": 4, "blocks": (BlockRef(D1, 5),)},
        {"type": EntryType.FILE, "size": 5, "blocks": (BlockRef("XYZ", 5),)},
        {"type": EntryType.DIRECTORY, "size": 3},
        {"type": EntryType.SYMLINK, "size": 0},
        {"type": EntryType.SYMLINK, "size": 3, "symlink_target": "abcd"},
        {"type": EntryType.FILE, "size": 0, "mode": 0o10000},
    ],
)
def test_inconsistent_entries_are_refused(fields: dict[str, object]) -> None:
    base: dict[str, object] = {"path": "x", "mode": 0o644, "mtime_ns": 0}
    with pytest.raises((ValueError, InvalidDigest)):
        ManifestEntry(**{**base, **fields})  # type: ignore[arg-type]
