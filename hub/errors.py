"""The hub's domain errors.

Every error the hub raises on purpose derives from :class:`HubError`. Its message is
written for the person at the other end (an operator at the command line, a spoke
reading a gRPC status) and names the offending value. The two outer layers translate
them in exactly one place each: :mod:`hub.serve.wire` maps the class to a gRPC status code
(:func:`hub.serve.wire.status_code`), :mod:`hub.cli.main` prints the message and exits 2
(1 for :class:`StorageError`, a failing system rather than bad input).
"""

from __future__ import annotations


class HubError(Exception):
    """Base class of every deliberate hub error; its message is shown to users as is."""


class InvalidArgument(HubError):
    """A malformed input: a name, reference, digest, size or address that can never be valid."""


class InvalidName(InvalidArgument):
    """A dataset name, tag name, version name or manifest path that breaks the naming rules."""


class InvalidDigest(InvalidArgument):
    """A block digest that is not 32 lowercase hex characters (an xxh3-128 hex digest)."""


class LimitExceeded(HubError):
    """A request beyond a configured bound: a message over the size limit, too many digests."""


class QuotaExceeded(LimitExceeded):
    """A caller over its share of what the hub holds for it (:mod:`hub.limits.budget`) or of the
    grants it may be issued (:class:`hub.auth.grants.GrantLimiter`): counted by ``limit`` in
    ``strata_hub_limit_refusals_total`` and audited.

    Attributes:
        limit: Which limit: ``streams``, ``bytes``, ``grants``, ``request`` (a request
            message not received within its deadline, :mod:`hub.serve.inbound`) or ``stall`` (a
            block's bytes not taken by the client within the stall timeout,
            :mod:`hub.limits.budget`).
    """

    def __init__(self, limit: str, message: str) -> None:
        super().__init__(message)
        self.limit = limit


class Unauthenticated(HubError):
    """The caller presented no bearer token, or one the hub does not know."""


class PermissionDenied(HubError):
    """The caller's token does not grant read access to the dataset asked for."""


class AlreadyExists(HubError):
    """Something immutable already exists and may not be written again."""


class VersionExists(AlreadyExists):
    """A publish named a version that is already published: versions never change."""


class Conflict(HubError):
    """The request is well formed but the catalog's state does not allow it now."""


class SequenceOutOfRange(HubError):
    """A Watch resumed from a sequence number the catalog no longer (or never) held."""


class NotFound(HubError):
    """A well-formed name or digest that the catalog or the blob store does not hold."""


class DatasetNotFound(NotFound):
    """The catalog has no dataset of that name."""


class RefNotFound(NotFound):
    """The dataset exists but has no such version or tag."""


class VersionRevoked(RefNotFound):
    """The version was revoked: it no longer resolves and its blocks are no longer served."""


class PathNotFound(NotFound):
    """The snapshot has no entry at that path."""


class NotADirectory(InvalidArgument):
    """A directory listing named a path that is a file or a symlink."""


class SnapshotNotFound(NotFound):
    """The catalog holds no manifest under that snapshot id."""


class BlockNotFound(NotFound):
    """The blob store holds no block with that digest."""


class DataDirNotFound(NotFound):
    """The data directory (or the catalog inside it) does not exist."""


class UnsafeDirectory(HubError):
    """A data directory or blob store another local user could change: theirs, on a path
    they could replace, or holding their files or a symlink (:mod:`strata_local.ownership`)."""


class SourceError(HubError):
    """The publish source tree cannot be published as is (missing, unreadable, odd file type)."""


class StorageError(HubError):
    """The blob store failed (I/O error, object store unreachable or refusing)."""


class CorruptBlob(HubError):
    """A stored blob's bytes do not match what the store promised (short read, bad digest)."""


class CatalogError(HubError):
    """The catalog cannot be opened or written (permissions, full map, foreign files)."""


class CorruptCatalog(CatalogError):
    """A catalog record could not be decoded; the catalog was written by something else."""


class CatalogUnavailable(CatalogError):
    """A shared catalog's engine cannot be reached now (down, restarting, partitioned); the
    call may succeed when retried."""


class ListenError(HubError):
    """The server could not bind its listen address (in use, not local, malformed)."""


class ConfigError(InvalidArgument):
    """A server setting is unusable: a token file, a certificate, a key, a size."""
