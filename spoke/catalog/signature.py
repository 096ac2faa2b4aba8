"""Publisher signatures, checked (``--publisher-key PUBFILE``): a spoke given the
publisher's Ed25519 public key uses only snapshots whose ``Snapshot.signature`` verifies
over :func:`protocol.signing.signed_message` of their dataset, version and snapshot id.

A snapshot that is unsigned or signed by another key is refused wherever it is resolved
(:class:`~spoke.catalog.catalog.SnapshotCatalog`): counted
(``strata_spoke_signature_refusals_total``), logged, and an error that the mount turns
into EIO and the admin API into 502; its manifest is never fetched or stored. That the
snapshot is the dataset and version asked for is checked first, key or not
(:meth:`~spoke.catalog.catalog.SnapshotCatalog.resolve_ref`): the signature then vouches for the
name as well as the content.
"""

from __future__ import annotations

from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from protocol.hub.v1 import hub_pb2
from protocol.signing import signed_message


class PublisherKeyError(ValueError):
    """The public key file is missing, unreadable or not an Ed25519 public key."""


class PublisherKey:
    """The publisher's public key.

    Args:
        key: the Ed25519 public key.
        path: where it was read from (for messages).
    """

    def __init__(self, key: Ed25519PublicKey, path: Path | None = None) -> None:
        self._key = key
        self.path = path

    @classmethod
    def from_file(cls, path: Path) -> PublisherKey:
        """The key in ``path`` (PEM SubjectPublicKeyInfo, as ``strata-hub keygen`` writes).

        Raises:
            PublisherKeyError: missing, unreadable, or not an Ed25519 public key.
        """
        what = f"--publisher-key {path}"
        try:
            raw = path.read_bytes()
        except OSError as err:
            raise PublisherKeyError(f"{what}: {err.strerror or err}") from None
        try:
            key = serialization.load_pem_public_key(raw)
        except (ValueError, TypeError) as err:
            raise PublisherKeyError(f"{what}: not a PEM public key ({err})") from None
        if not isinstance(key, Ed25519PublicKey):
            raise PublisherKeyError(f"{what}: not an Ed25519 key (strata-hub keygen makes one)")
        return cls(key, path)

    def problem(self, snapshot: hub_pb2.Snapshot) -> str | None:
        """Why ``snapshot`` may not be used (None: its signature verifies)."""
        if not snapshot.signature:
            return "it is not signed"
        try:
            message = signed_message(snapshot.dataset, snapshot.version, snapshot.snapshot_id)
            self._key.verify(snapshot.signature, message)
        except (InvalidSignature, ValueError):
            return "its signature does not verify with the publisher key"
        return None
