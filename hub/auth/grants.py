"""Read grants: the hub's short-lived, signed statement of what a caller may read.

A spoke asks for one (``IssueGrant``) with the public half of a key it generated in
memory; the hub answers with the caller's dataset scopes, that key, the spoke's mesh node
name and an expiry, signed with its grant key (Ed25519, RFC 8032; the message is
:func:`protocol.grants.grant_message`). The spoke's peers check the signature with the
hub's public key (``GrantKeys``) and serve the spoke only blocks of datasets the grant
covers; a narrowed or revoked token is honoured by peers once the grants issued before
expire, within :data:`DEFAULT_LIFETIME_S` by default (``spoke/DESIGN.md``, "Mesh trust").

The grant key is ``--grant-key FILE`` (PEM PKCS#8, as ``strata-hub keygen`` writes it) or
else ``DATA_DIR/grant.key``, generated at the first ``serve`` (mode 0600, never
overwritten). Hubs sharing a data directory, or given the same file, issue grants every
spoke of the region accepts.
"""

from __future__ import annotations

import collections
import datetime
import logging
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from hub.auth.keys import load_private_key
from hub.auth.tokens import Principal
from hub.errors import ConfigError, InvalidArgument, QuotaExceeded
from protocol.grants import PUBLIC_KEY_BYTES, grant_message, key_id
from protocol.hub.v1 import hub_pb2

logger = logging.getLogger(__name__)

DEFAULT_LIFETIME_S = 120.0
"""How long a grant is valid by default, seconds (``--grant-lifetime``)."""

MAX_LIFETIME_S = 300.0
"""Longest grant lifetime accepted, seconds: the most a narrowed token can still be used
at a peer."""

MIN_LIFETIME_S = 1.0
"""Shortest grant lifetime accepted, seconds (tests narrow tokens with short grants)."""

MAX_NODE_CHARS = 255
"""Longest node name recorded in a grant."""

HOLDERS_PER_TOKEN = 256
"""Default most holder keys one token may hold live grants for (``--grant-holders-per-token``):
what a region of 128 nodes sharing one token needs, each with a second key for the lifetime
after a restart (its in-memory key is new). More keys buy a caller nothing at the peers,
whose allowances are per token subject (:mod:`spoke.mesh.admission`), so the bound only
keeps a token from minting grants without end (at most 256 x :data:`ISSUES_PER_HOLDER`
signatures a lifetime, about 9 a second at 120 s)."""

ISSUES_PER_HOLDER = 4
"""Most grants issued to one holder key within a grant lifetime: a spoke renews at half
the lifetime (:class:`spoke.mesh.grants.GrantKeeper`), so at most 3 fall in any window of
one lifetime; one more for a renewal whose answer was lost and retried."""

KEY_FILE = "grant.key"
"""The generated grant key's name in the data directory."""


def _raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def load_grant_key(path: Path) -> Ed25519PrivateKey:
    """The Ed25519 private key in ``path`` (PEM, unencrypted, owner-only).

    Raises:
        ConfigError: missing, unreadable, readable by group or others, or not Ed25519.
    """
    return load_private_key(path, f"grant key {path}", ConfigError)


def ensure_grant_key(data_dir: Path) -> Path:
    """``DATA_DIR/grant.key``, generated (mode 0600) if it does not exist yet.

    Raises:
        ConfigError: it cannot be created (give ``--grant-key``).
    """
    path = data_dir / KEY_FILE
    if path.exists():
        return path
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:  # another hub on this data dir made it first
        return path
    except OSError as err:
        raise ConfigError(
            f"cannot create the grant key {path}: {err.strerror or err} (give --grant-key)"
        ) from None
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    logger.info("generated the grant key %s", path)
    return path


class GrantIssuer:
    """Signs read grants with one Ed25519 key.

    Args:
        key: the grant-signing key.
        lifetime_s: how long each grant is valid, seconds.
        now_ns: the clock (nanoseconds since the epoch; injectable for tests).

    Raises:
        ConfigError: ``lifetime_s`` is outside [:data:`MIN_LIFETIME_S`,
            :data:`MAX_LIFETIME_S`].
    """

    def __init__(
        self,
        key: Ed25519PrivateKey,
        lifetime_s: float = DEFAULT_LIFETIME_S,
        now_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        if not MIN_LIFETIME_S <= lifetime_s <= MAX_LIFETIME_S:
            raise ConfigError(
                f"grant lifetime {lifetime_s:g} s is not between {MIN_LIFETIME_S:g} and "
                f"{MAX_LIFETIME_S:g} s"
            )
        self._key = key
        self.public_key = _raw_public(key.public_key())
        self.key_id = key_id(self.public_key)
        self.lifetime_s = lifetime_s
        self._now_ns = now_ns

    @classmethod
    def from_file(cls, path: Path, lifetime_s: float = DEFAULT_LIFETIME_S) -> GrantIssuer:
        """An issuer signing with the key in ``path``.

        Raises:
            ConfigError: the key is unusable, or the lifetime out of range.
        """
        return cls(load_grant_key(path), lifetime_s)

    def keys(self) -> hub_pb2.GrantKeysResponse:
        """The public keys grants are signed with."""
        return hub_pb2.GrantKeysResponse(
            keys=[hub_pb2.GrantKey(key_id=self.key_id, public_key=self.public_key)]
        )

    def check(self, request: hub_pb2.IssueGrantRequest) -> None:
        """Checks a grant request's holder key and node name.

        Raises:
            InvalidArgument: the holder key is not a 32-byte Ed25519 public key, or the
                node name is empty, too long or not printable ASCII.
        """
        holder = request.holder_key
        if len(holder) != PUBLIC_KEY_BYTES:
            raise InvalidArgument(
                f"holder_key must be a {PUBLIC_KEY_BYTES}-byte Ed25519 public key, "
                f"got {len(holder)} bytes"
            )
        try:
            Ed25519PublicKey.from_public_bytes(holder)
        except ValueError:
            raise InvalidArgument("holder_key is not an Ed25519 public key") from None
        node = request.node
        if not node or len(node) > MAX_NODE_CHARS or not all(0x21 <= ord(c) <= 0x7E for c in node):
            raise InvalidArgument(
                f"node must be 1 to {MAX_NODE_CHARS} visible ASCII characters (HOST:PORT)"
            )

    def issue(self, principal: Principal, request: hub_pb2.IssueGrantRequest) -> hub_pb2.ReadGrant:
        """A grant of ``principal``'s scopes to the holder of ``request.holder_key``.

        It expires after the lifetime, or when the principal's token does if sooner.

        Raises:
            InvalidArgument: as :meth:`check`.
        """
        self.check(request)
        holder, node = request.holder_key, request.node
        issued = self._now_ns()
        expires = issued + int(self.lifetime_s * 1e9)
        if principal.expires is not None:
            token_end = int(principal.expires.astimezone(datetime.UTC).timestamp() * 1e9)
            expires = min(expires, token_end)
        claims = hub_pb2.GrantClaims(
            grant_id=secrets.token_hex(8),
            subject=principal.name,
            scopes=list(principal.scopes),
            holder_key=holder,
            node=node,
            issued_ns=issued,
            expires_ns=expires,
            key_id=self.key_id,
        ).SerializeToString()
        return hub_pb2.ReadGrant(
            claims=claims, signature=self._key.sign(grant_message(claims)), key_id=self.key_id
        )


class GrantLimiter:
    """How many grants a token may be issued: live holder keys and renewals per key.

    A grant multiplies what its token may do at the spokes' peers, which bound each holder
    key on its own; so a token holds live grants (issued within the last lifetime) for at
    most ``holders`` keys, and one key is issued at most :data:`ISSUES_PER_HOLDER` grants
    per lifetime. A well-behaved spoke uses one key for as long as it runs and renews it
    at half the lifetime: it is never refused. Beyond either, ``IssueGrant`` answers
    RESOURCE_EXHAUSTED; a key frees its slot one lifetime after its last grant.

    Args:
        lifetime_s: The grant lifetime, seconds (the window counted over).
        holders: Most live holder keys per token.
        per_holder: Most grants per holder key per lifetime.
        mono: Monotonic clock, seconds (injectable for tests).
    """

    def __init__(
        self,
        lifetime_s: float,
        holders: int = HOLDERS_PER_TOKEN,
        per_holder: int = ISSUES_PER_HOLDER,
        mono: Callable[[], float] = time.monotonic,
    ) -> None:
        if holders < 1 or per_holder < 1:
            raise ConfigError(f"--grant-holders-per-token {holders} is not at least 1")
        self.lifetime_s = lifetime_s
        self.holders = holders
        self.per_holder = per_holder
        self._mono = mono
        self._issued: dict[str, dict[bytes, collections.deque[float]]] = {}

    def live(self, name: str) -> int:
        """Holder keys of principal ``name`` with a grant issued within a lifetime."""
        self._prune(name, self._mono())
        return len(self._issued.get(name, {}))

    def _prune(self, name: str, now: float) -> None:
        keys = self._issued.get(name)
        if keys is None:
            return
        for holder in list(keys):
            times = keys[holder]
            while times and times[0] <= now - self.lifetime_s:
                times.popleft()
            if not times:
                del keys[holder]
        if not keys:
            del self._issued[name]

    def take(self, name: str, holder: bytes) -> None:
        """Counts a grant to ``holder`` for principal ``name``.

        Raises:
            QuotaExceeded: the token already holds live grants for :attr:`holders` other
                keys, or this key was issued :attr:`per_holder` grants within a lifetime.
        """
        now = self._mono()
        self._prune(name, now)
        keys = self._issued.setdefault(name, {})
        times = keys.get(holder)
        if times is None and len(keys) >= self.holders:
            oldest = min(t[-1] for t in keys.values())
            raise QuotaExceeded(
                "grants",
                f"token {name} holds live read grants for {len(keys)} holder keys, the most "
                f"this hub allows one token (--grant-holders-per-token {self.holders}); "
                f"renew a grant with its own key, or retry in "
                f"{oldest + self.lifetime_s - now:.0f} s",
            )
        if times is not None and len(times) >= self.per_holder:
            raise QuotaExceeded(
                "grants",
                f"holder key of token {name} was issued {len(times)} read grants within "
                f"{self.lifetime_s:g} s (the grant lifetime), the most allowed; a grant is "
                f"renewed at half its lifetime: retry in "
                f"{times[0] + self.lifetime_s - now:.0f} s",
            )
        keys.setdefault(holder, collections.deque()).append(now)
