"""What the catalog returns: datasets, snapshots (versions), tags, revocations, publishes, stats."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Dataset:
    """A dataset as listed by the catalog.

    Attributes:
        name: The dataset's name.
        version_count: Number of live (unrevoked) versions.
        latest_version: The newest live version's name, e.g. ``"v3"``; empty when none.
    """

    name: str
    version_count: int
    latest_version: str


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One version of a dataset.

    Attributes:
        dataset: The dataset's name.
        version: The version's name, e.g. ``"v3"``.
        snapshot_id: xxh3-128 of the canonical manifest, 32 lowercase hex characters.
        created_ns: Publish time, nanoseconds since the Unix epoch.
        block_size: Maximum block length, bytes.
        file_count: Number of regular files.
        total_bytes: Sum of regular file sizes, bytes.
        entry_count: Number of manifest entries (files, directories and symlinks).
        revoked_ns: When the version was revoked, nanoseconds since the Unix epoch; 0
            while it is live.
        signature: The publisher's Ed25519 signature (:mod:`hub.auth.signing`); empty when
            published unsigned.
    """

    dataset: str
    version: str
    snapshot_id: str
    created_ns: int
    block_size: int
    file_count: int
    total_bytes: int
    entry_count: int
    revoked_ns: int = 0
    signature: bytes = b""

    @property
    def revoked(self) -> bool:
        """True once the version was revoked."""
        return self.revoked_ns != 0


@dataclass(frozen=True, slots=True)
class Tag:
    """A movable name for a version.

    Attributes:
        name: The tag, e.g. ``"latest"``.
        version: The version it points at, e.g. ``"v3"``.
    """

    name: str
    version: str


@dataclass(frozen=True, slots=True)
class Revocation:
    """What revoking a version did.

    Attributes:
        snapshot: The version, now revoked.
        removed_tags: Tags that pointed at it and were removed, in name order.
        manifest_dropped: True when no live version shares the snapshot any more, so its
            manifest was deleted.
    """

    snapshot: Snapshot
    removed_tags: tuple[str, ...]
    manifest_dropped: bool


@dataclass(frozen=True, slots=True)
class PublishRecord:
    """A publish in progress (or abandoned by a crashed process).

    Attributes:
        publish_id: The publish's number (also its staged manifest's number).
        started_ns: When it began, nanoseconds since the Unix epoch.
        pid: The publishing process's id.
        host: The publishing machine's host name.
    """

    publish_id: int
    started_ns: int
    pid: int
    host: str


@dataclass(frozen=True, slots=True)
class CatalogStats:
    """Sizes of the catalog, for metrics.

    Attributes:
        datasets: Datasets.
        versions: Versions ever published (live and revoked).
        revoked_versions: Revoked versions.
        tags: Tags.
        snapshots: Distinct snapshots with a live version.
        blocks: Distinct blocks referenced by live versions.
        block_bytes: Bytes of those blocks.
        publishes_in_progress: Publishes staged but not committed (or abandoned).
        last_sequence: Sequence number of the newest event (0 when none).
        map_used_bytes: Bytes the catalog takes: the LMDB map in use, or the PostgreSQL
            table with its index.
    """

    datasets: int
    versions: int
    revoked_versions: int
    tags: int
    snapshots: int
    blocks: int
    block_bytes: int
    publishes_in_progress: int
    last_sequence: int
    map_used_bytes: int
