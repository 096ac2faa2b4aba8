"""Publisher signatures (optional): an Ed25519 key pair, the private half given to
``strata-hub publish --signing-key``, the public half to spokes (``--publisher-key``).

``strata-hub keygen PRIVATE PUBLIC`` writes both as PEM (PKCS#8, mode 0600; and
SubjectPublicKeyInfo). At commit the publisher signs
:func:`protocol.signing.signed_message` of the new version; the catalog stores the
signature beside the version and every ``Snapshot`` the hub serves carries it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hub.auth.keys import load_private_key
from hub.errors import HubError
from protocol.signing import signed_message

Signer = Callable[[str, str, str], bytes]
"""Signs (dataset, version, snapshot id); returns the 64-byte signature."""


class SigningKeyError(HubError):
    """A signing key file is missing, unreadable, too open or not an Ed25519 private key."""


def keygen(private: Path, public: Path) -> None:
    """Write a new Ed25519 key pair: ``private`` (PEM PKCS#8, mode 0600), ``public`` (PEM).

    Raises:
        SigningKeyError: either file exists (a key is never overwritten) or cannot be written.
    """
    for path in (private, public):
        if path.exists():
            raise SigningKeyError(f"{path} exists: keys are never overwritten")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    pub = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    try:
        fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(pem)
        public.write_bytes(pub)
    except OSError as err:
        raise SigningKeyError(f"cannot write the key pair: {err}") from None


def load_signer(path: Path) -> Signer:
    """The signer of the Ed25519 private key in ``path`` (PEM, unencrypted).

    Raises:
        SigningKeyError: missing, unreadable, readable by group or others, or not an
            Ed25519 private key.
    """
    key = load_private_key(path, f"--signing-key {path}", SigningKeyError)

    def sign(dataset: str, version: str, snapshot_id: str) -> bytes:
        return key.sign(signed_message(dataset, version, snapshot_id))

    return sign
