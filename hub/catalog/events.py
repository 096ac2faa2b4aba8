"""Catalog events: what changed, numbered in commit order.

Every change to the catalog (a version published, a tag set, moved or removed, a version
revoked) appends one :class:`Event` per effect to the catalog's ``events`` table, in the
same LMDB write transaction as the change itself, under the next sequence number. So the
sequence is gap-free and strictly increasing, an event exists if and only if its change
was committed, and a reader that has processed every event up to ``n`` can resume with
"everything after ``n``" and miss nothing (the list-then-watch pattern of Kubernetes'
``resourceVersion``). ``Watch`` (:mod:`hub.serve.watch`) streams them.

Record format (integers big-endian): ``kind u8 | time_ns i64 | version u32 |
previous_version u32 | snapshot_id 16 bytes | duration_ns u64 | dataset_len u16 | dataset
(UTF-8) | tag (UTF-8, the rest)``. Version 0 means "none"; an all-zero snapshot id means
"none".
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from hub.errors import CorruptCatalog
from hub.snapshot.names import version_name

_FIXED = struct.Struct(">BqII16sQH")
_NO_SNAPSHOT = bytes(16)


class EventKind(enum.IntEnum):
    """What an event reports; the values are those of ``protocol.hub.v1.EventKind``."""

    VERSION_PUBLISHED = 1
    TAG_MOVED = 2
    TAG_REMOVED = 3
    VERSION_REVOKED = 4


@dataclass(frozen=True, slots=True)
class Event:
    """One committed change of the catalog.

    Attributes:
        sequence: Position in the catalog's event log, from 1, gap-free.
        kind: What happened.
        dataset: The dataset it happened to.
        time_ns: Commit time, nanoseconds since the Unix epoch.
        version: The version published or revoked, or the version a tag now points at
            (0 when a tag was removed).
        previous_version: For tag events, the version the tag pointed at before (0 when
            the tag is new); 0 otherwise.
        tag: The tag, for tag events; empty otherwise.
        snapshot_id: For published and revoked versions, the snapshot id (32 hex
            characters); empty otherwise.
        duration_ns: For published versions, how long the publish took from its start to
            its commit, nanoseconds; 0 otherwise.
    """

    sequence: int
    kind: EventKind
    dataset: str
    time_ns: int
    version: int = 0
    previous_version: int = 0
    tag: str = ""
    snapshot_id: str = ""
    duration_ns: int = 0

    @property
    def version_name(self) -> str:
        """``version`` as a name (``"v3"``), or ``""`` when there is none."""
        return version_name(self.version) if self.version else ""

    @property
    def previous_version_name(self) -> str:
        """``previous_version`` as a name, or ``""`` when there is none."""
        return version_name(self.previous_version) if self.previous_version else ""


def encode_event(event: Event) -> bytes:
    """Serializes an event's record (everything but the sequence, which is its key).

    Args:
        event: The event.

    Returns:
        The record's bytes.
    """
    dataset = event.dataset.encode("utf-8")
    snapshot = bytes.fromhex(event.snapshot_id) if event.snapshot_id else _NO_SNAPSHOT
    return (
        _FIXED.pack(
            int(event.kind),
            event.time_ns,
            event.version,
            event.previous_version,
            snapshot,
            event.duration_ns,
            len(dataset),
        )
        + dataset
        + event.tag.encode("utf-8")
    )


def decode_event(sequence: int, record: bytes) -> Event:
    """Parses a record written by :func:`encode_event`.

    Args:
        sequence: The record's key.
        record: The record's bytes.

    Returns:
        The event.

    Raises:
        CorruptCatalog: The record is truncated or holds an unknown kind.
    """
    try:
        kind, time_ns, version, previous, snapshot, duration_ns, dataset_len = _FIXED.unpack_from(
            record
        )
        rest = record[_FIXED.size :]
        if len(rest) < dataset_len:
            raise ValueError("truncated dataset name")
        return Event(
            sequence=sequence,
            kind=EventKind(kind),
            dataset=rest[:dataset_len].decode("utf-8"),
            time_ns=time_ns,
            version=version,
            previous_version=previous,
            tag=rest[dataset_len:].decode("utf-8"),
            snapshot_id="" if snapshot == _NO_SNAPSHOT else snapshot.hex(),
            duration_ns=duration_ns,
        )
    except (struct.error, ValueError, UnicodeDecodeError) as exc:
        raise CorruptCatalog(f"corrupt event record {sequence}: {exc}") from exc
