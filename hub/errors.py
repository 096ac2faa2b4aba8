"""The hub's domain errors.

Every error the hub raises on purpose derives from :class:`HubError`. Its message is
written for the person at the other end (an operator at the command line, a spoke
reading a gRPC status) and names the offending value. The two outer layers translate
them in exactly one place each: :mod:`hub.service` maps the class to a gRPC status code
(:func:`hub.service.status_code`), :mod:`hub.cli` prints the message and exits 2.
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


class NotFound(HubError):
    """A well-formed name or digest that the catalog or the blob store does not hold."""


class DatasetNotFound(NotFound):
    """The catalog has no dataset of that name."""


class RefNotFound(NotFound):
    """The dataset exists but has no such version or tag."""


class SnapshotNotFound(NotFound):
    """The catalog holds no manifest under that snapshot id."""


class BlockNotFound(NotFound):
    """The blob store holds no block with that digest."""


class DataDirNotFound(NotFound):
    """The data directory (or the catalog inside it) does not exist."""


class SourceError(HubError):
    """The publish source tree cannot be published as is (missing, unreadable, odd file type)."""


class CorruptBlob(HubError):
    """A stored blob's bytes do not match what the store promised (short read, bad digest)."""


class CatalogError(HubError):
    """The catalog cannot be opened or written (permissions, full map, foreign files)."""


class CorruptCatalog(CatalogError):
    """A catalog record could not be decoded; the catalog was written by something else."""


class ListenError(HubError):
    """The server could not bind its listen address (in use, not local, malformed)."""
