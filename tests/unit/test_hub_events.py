"""Catalog events: encoding, sequence numbers written with each change, pruning."""

from __future__ import annotations

from pathlib import Path

import pytest

from hub.catalog.events import Event, EventKind, decode_event, encode_event
from hub.errors import CorruptCatalog, InvalidArgument
from hub.snapshot.blocks import block_digest
from hub.snapshot.manifest import EntryType, ManifestEntry
from tests.catalogs import CatalogAt
from tests.unit.hub_support import add_version


def test_events_round_trip() -> None:
    event = Event(7, EventKind.TAG_MOVED, "f3.small-1", 123, 4, 3, "latest", "", 0)
    assert decode_event(7, encode_event(event)) == event
    published = Event(1, EventKind.VERSION_PUBLISHED, "f3", 5, 1, snapshot_id="ab" * 16)
    assert decode_event(1, encode_event(published)) == published
    assert published.version_name == "v1" and published.previous_version_name == ""
    with pytest.raises(CorruptCatalog):
        decode_event(1, encode_event(event)[:10])


def entry(path: str, content: bytes) -> ManifestEntry:
    from hub.snapshot.blocks import BlockRef

    ref = BlockRef(block_digest(content), len(content))
    return ManifestEntry(path, EntryType.FILE, 0o644, len(content), 0, blocks=(ref,))


def test_each_change_appends_gap_free_events(tmp_path: Path, engine: CatalogAt) -> None:
    with engine.open(tmp_path) as catalog:
        assert (catalog.last_sequence(), catalog.first_sequence()) == (0, 1)
        add_version(catalog, "f3", 4096, [entry("a", b"a")])
        add_version(catalog, "f3", 4096, [entry("a", b"b")], tag=None)
        catalog.set_tag("f3", "latest", "v1")  # unchanged: no event
        catalog.set_tag("f3", "latest", "v2")
        catalog.remove_tag("f3", "latest")
        catalog.revoke("f3", "v1")
        events = catalog.events_after(0)
        assert [e.sequence for e in events] == list(range(1, 7))
        assert [(e.kind, e.version, e.previous_version, e.tag) for e in events] == [
            (EventKind.VERSION_PUBLISHED, 1, 0, ""),
            (EventKind.TAG_MOVED, 1, 0, "latest"),
            (EventKind.VERSION_PUBLISHED, 2, 0, ""),
            (EventKind.TAG_MOVED, 2, 1, "latest"),
            (EventKind.TAG_REMOVED, 0, 2, "latest"),
            (EventKind.VERSION_REVOKED, 1, 0, ""),
        ]
        assert events[0].duration_ns >= 0 and len(events[0].snapshot_id) == 32
        assert catalog.events_after(4, limit=1) == [events[4]]
        assert catalog.prune_events(2) == 4
        assert catalog.first_sequence() == 5 and catalog.last_sequence() == 6
        assert catalog.prune_events(0) == 2
        assert catalog.first_sequence() == 7, "the counter survives pruning everything"
        add_version(catalog, "f3", 4096, [entry("a", b"c")], tag=None)
        assert [e.sequence for e in catalog.events_after(0)] == [7]
        with pytest.raises(InvalidArgument):
            catalog.prune_events(-1)


def test_a_failed_change_appends_no_event(tmp_path: Path, engine: CatalogAt) -> None:
    with engine.open(tmp_path) as catalog:
        add_version(catalog, "f3", 4096, [entry("a", b"a")])
        with pytest.raises(Exception, match="no version"):
            catalog.set_tag("f3", "x", "v9")
        assert catalog.last_sequence() == 2
