"""Domain errors of the spoke daemon; :mod:`spoke.serve.local` maps them to gRPC codes."""

from __future__ import annotations


class SpokeError(Exception):
    """Base class of the spoke's domain errors."""


class NotFound(SpokeError):
    """The hub says the dataset, version, tag or block does not exist."""


class InvalidRequest(SpokeError):
    """A malformed name, ref or digest."""


class OverLimit(InvalidRequest):
    """A request that would pass a memory cap (a 400 whose body names it).

    Attributes:
        limit: The cap's name, e.g. ``total_positions``.
        value: The cap's value.
    """

    def __init__(self, message: str, limit: str, value: int) -> None:
        super().__init__(message)
        self.limit = limit
        self.value = value


class HubUnavailable(SpokeError):
    """The hub could not be reached before the deadline and nothing usable is cached."""


class CorruptBlock(SpokeError):
    """Bytes did not match their digest (from the hub, or read back from disk)."""


class AccessDenied(SpokeError):
    """The hub refused this spoke's token for the dataset (outside the token's scope)."""


class CorruptManifest(SpokeError):
    """A manifest from the hub does not hash to the snapshot id it was resolved as."""


class UnsignedSnapshot(CorruptManifest):
    """A snapshot without a valid publisher signature, on a spoke given ``--publisher-key``
    (handled everywhere as a corrupt manifest: EIO in the mount, 502 from the admin API)."""


class SnapshotMismatch(CorruptManifest):
    """The hub answered a name with another snapshot: another dataset's, or another version
    than the one asked for (handled as a corrupt manifest: EIO in the mount, 502 from the
    admin API)."""


class MissDeadline(HubUnavailable):
    """A miss gave up: the hub did not deliver before ``--miss-deadline`` (a read then fails
    with EIO at once: the mount does not retry it, unlike a daemon it cannot reach)."""
