"""Reading an Ed25519 private key the hub signs with: read grants (:mod:`hub.auth.grants`)
and publisher signatures (:mod:`hub.auth.signing`) load theirs the same way, refusing a
key another local user could read."""

from __future__ import annotations

import stat
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hub.errors import HubError


def load_private_key(path: Path, what: str, error: type[HubError]) -> Ed25519PrivateKey:
    """The Ed25519 private key in ``path`` (PEM, unencrypted, owner-only).

    Args:
        path: The key file.
        what: How messages name it (``grant key PATH``, ``--signing-key PATH``).
        error: The error class raised, with a one-line message starting with ``what``.

    Raises:
        HubError: (of class ``error``) missing, unreadable, readable by group or others,
            not an unencrypted PEM private key, or not Ed25519.
    """
    try:
        mode = path.stat().st_mode
        raw = path.read_bytes()
    except OSError as err:
        raise error(f"{what}: {err.strerror or err}") from None
    if mode & 0o077:
        raise error(
            f"{what}: readable by group or others (mode {stat.S_IMODE(mode):04o}); chmod 600 it"
        )
    try:
        key = serialization.load_pem_private_key(raw, password=None)
    except (ValueError, TypeError) as err:
        raise error(f"{what}: not an unencrypted PEM private key ({err})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise error(f"{what}: not an Ed25519 key (strata-hub keygen makes one)")
    return key
