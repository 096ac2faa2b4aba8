"""This spoke's read grant (the caller's side) and the hub's grant keys (the owner's side).

:class:`GrantKeeper` generates an Ed25519 holder key in memory at start (it never leaves the
process), asks the hub for a grant of this spoke's scopes to it (``IssueGrant``), and
refreshes the grant at half its lifetime, retrying with exponential backoff and jitter
(tenacity) while the hub refuses or cannot be reached. Each peer call carries the grant and
a fresh proof of possession of the holder key naming the spoke called
(:func:`protocol.grants.proof_message`; DPoP, RFC 9449). Without a valid grant the mesh
source asks only the hub: a spoke whose token was narrowed or revoked loses its peers with
its next refresh, and its peers stop honouring the old grant when it expires.

:class:`HubGrantKeys` holds the public keys grants are verified with: the pinned
``--peer-grant-key`` file, or else the hub's ``GrantKeys`` answer, fetched at start, at
every grant refresh and (at most every :data:`KEYS_RECHECK_S`) when a peer shows a grant
signed by a key not known yet.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from pathlib import Path

import grpc.aio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    wait_exponential_jitter,
)

from protocol.grants import GRANT_METADATA, NONCE_BYTES, PROOF_METADATA, key_id, proof_message
from protocol.hub.v1 import hub_pb2
from protocol.spoke.v1 import peer_pb2
from spoke.hublink.client import HubClient
from spoke.mesh import metrics

log = logging.getLogger(__name__)

KEYS_RECHECK_S = 10.0
"""Least time between two ``GrantKeys`` calls made for an unknown key id, seconds."""

USABLE_MARGIN_S = 1.0
"""A grant is no longer shown to peers this long before it expires, seconds (their
clocks may run a little ahead)."""


class GrantKeyError(ValueError):
    """A pinned grant key file is missing, unreadable or not an Ed25519 public key."""


def load_public_key(path: Path) -> Ed25519PublicKey:
    """The Ed25519 public key in ``path`` (PEM SubjectPublicKeyInfo, as ``strata-hub
    keygen`` writes its PUBLIC file).

    Raises:
        GrantKeyError: missing, unreadable, or not an Ed25519 public key.
    """
    what = f"--peer-grant-key {path}"
    try:
        key = serialization.load_pem_public_key(path.read_bytes())
    except OSError as err:
        raise GrantKeyError(f"{what}: {err.strerror or err}") from None
    except (ValueError, TypeError) as err:
        raise GrantKeyError(f"{what}: not a PEM public key ({err})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise GrantKeyError(f"{what}: not an Ed25519 key")
    return key


def raw_public(key: Ed25519PublicKey) -> bytes:
    """The 32 raw bytes of an Ed25519 public key."""
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


class HubGrantKeys:
    """The public keys read grants are verified with, by key id.

    Args:
        hub: asked for the keys (``GrantKeys``) unless ``pinned``.
        pinned: the hub's key from ``--peer-grant-key`` (then the hub is never asked).
        now: the monotonic clock (injectable for tests).
    """

    def __init__(
        self,
        hub: HubClient | None,
        pinned: Ed25519PublicKey | None = None,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.hub = hub
        self.pinned = pinned is not None
        self._keys: dict[str, Ed25519PublicKey] = {}
        if pinned is not None:
            self._keys[key_id(raw_public(pinned))] = pinned
        self._now = now
        self._asked = -KEYS_RECHECK_S
        self._fetching: asyncio.Task[None] | None = None

    def get(self, kid: str) -> Ed25519PublicKey | None:
        """The key ``kid``, or None (an unknown id makes the next refresh ask the hub)."""
        key = self._keys.get(kid)
        if key is None and not self.pinned and self.hub is not None:
            now = self._now()
            if now - self._asked >= KEYS_RECHECK_S and self._fetching is None:
                self._asked = now
                self._fetching = asyncio.get_running_loop().create_task(self._fetch_quietly())
        return key

    async def _fetch_quietly(self) -> None:
        try:
            await self.fetch()
        except grpc.aio.AioRpcError as err:
            log.warning("hub grant keys: %s", err.details())
        finally:
            self._fetching = None

    async def fetch(self) -> None:
        """Ask the hub for its keys now (nothing when pinned).

        Raises:
            grpc.aio.AioRpcError: the hub did not answer.
        """
        if self.pinned or self.hub is None:
            return
        reply = await self.hub.grant_keys()
        keys = {}
        for key in reply.keys:
            try:
                public = Ed25519PublicKey.from_public_bytes(key.public_key)
            except ValueError:
                log.warning("hub grant key %s is not an Ed25519 key; ignored", key.key_id)
                continue
            keys[key_id(key.public_key)] = public
        self._keys = keys

    async def close(self) -> None:
        """Stop a fetch in flight."""
        if self._fetching is not None:
            self._fetching.cancel()
            await asyncio.gather(self._fetching, return_exceptions=True)


class GrantKeeper:
    """This spoke's read grant, kept fresh.

    Args:
        hub: issues the grants.
        node: this spoke's mesh node name (recorded in the grant).
        keys: refreshed along with the grant (the owner side's verification keys).
        mono: the monotonic clock; ``wall_ns`` the wall clock in ns (both injectable).
    """

    def __init__(
        self,
        hub: HubClient,
        node: str,
        keys: HubGrantKeys | None = None,
        mono: Callable[[], float] = time.monotonic,
        wall_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.hub = hub
        self.node = node
        self.keys = keys
        self._holder = Ed25519PrivateKey.generate()
        self.holder_key = raw_public(self._holder.public_key())
        self._mono = mono
        self._wall_ns = wall_ns
        self.grant: hub_pb2.ReadGrant | None = None
        self.claims: hub_pb2.GrantClaims | None = None
        self._usable_until = 0.0
        self._lifetime = 0.0
        self.problem: str | None = "no grant yet"

    @property
    def valid(self) -> bool:
        """Whether a grant is in hand and not about to expire."""
        return self.grant is not None and self._mono() < self._usable_until

    async def fetch(self) -> float:
        """Get a new grant (and the hub's keys); returns its lifetime in seconds.

        Raises:
            grpc.aio.AioRpcError: the hub refused or did not answer.
        """
        received = self._mono()
        grant = await self.hub.issue_grant(self.holder_key, self.node)
        claims = hub_pb2.GrantClaims.FromString(grant.claims)
        lifetime = max(0.0, (claims.expires_ns - claims.issued_ns) / 1e9)
        self.grant, self.claims = grant, claims
        self._lifetime = lifetime
        self._usable_until = received + lifetime - min(USABLE_MARGIN_S, lifetime / 4)
        if self.problem is not None:
            log.info(
                "read grant %s for %s: datasets %s, %g s",
                claims.grant_id,
                claims.subject,
                ",".join(claims.scopes),
                lifetime,
            )
        self.problem = None
        metrics.GRANT_REFRESHES.labels("ok").inc()
        metrics.GRANT_EXPIRY.set(claims.expires_ns / 1e9)
        if self.keys is not None:
            await self.keys.fetch()
        return lifetime

    async def run(self) -> None:
        """Refresh at half of each grant's lifetime, forever (the first fetch at once when
        no grant is in hand); retry failures with backoff (0.5 s doubling to 30 s,
        jittered), never giving up: the mesh comes back when the hub does."""
        while True:
            if self.valid:
                await asyncio.sleep(max(self._lifetime / 2, 0.5))
            async for attempt in AsyncRetrying(
                wait=wait_exponential_jitter(initial=0.5, max=30.0),
                retry=retry_if_exception_type(Exception),
                before_sleep=self._failed,
            ):
                with attempt:
                    await self.fetch()

    def _failed(self, state: RetryCallState) -> None:
        err = state.outcome.exception() if state.outcome is not None else None
        why = err.details() if isinstance(err, grpc.aio.AioRpcError) else str(err)
        metrics.GRANT_REFRESHES.labels("failed").inc()
        if why != self.problem:
            level = logging.WARNING if self.valid else logging.ERROR
            log.log(
                level,
                "no read grant from the hub: %s (blocks come from the hub only until one is "
                "granted)",
                why,
            )
        self.problem = why

    def metadata(self, target: str, method: str) -> tuple[tuple[str, bytes], ...]:
        """Call metadata for ``method`` on ``target``: the grant and a fresh proof of
        possession of its holder key (empty without a valid grant)."""
        if not self.valid or self.grant is None:
            return ()
        nonce = secrets.token_bytes(NONCE_BYTES)
        now = self._wall_ns()
        signature = self._holder.sign(proof_message(target, method, now, nonce, self.grant.claims))
        proof = peer_pb2.PeerProof(time_ns=now, nonce=nonce, signature=signature, target=target)
        return (
            (GRANT_METADATA, self.grant.SerializeToString()),
            (PROOF_METADATA, proof.SerializeToString()),
        )

    def snapshot(self) -> dict[str, object]:
        """JSON-ready: the grant in use (id, subject, scopes, seconds left) or why none."""
        if self.claims is None or not self.valid:
            return {"valid": False, "problem": self.problem}
        left = self.claims.expires_ns / 1e9 - self._wall_ns() / 1e9
        return {
            "valid": True,
            "id": self.claims.grant_id,
            "subject": self.claims.subject,
            "datasets": list(self.claims.scopes),
            "expires_in_s": round(left, 1),
        }
