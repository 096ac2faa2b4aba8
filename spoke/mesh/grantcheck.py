"""The owner's check of a caller's read grant and proof of possession.

A call to the peer port is served only when, in this order (the first failure names the
refusal, the ``reason`` of ``strata_spoke_peer_refusals_total``):

1. it carries a grant (``no_grant``) that parses (``malformed``), signed by a hub key this
   spoke knows (``unknown_key``) with a valid signature (``bad_signature``);
2. the grant is current: not past its expiry, nor issued in the future, by more than
   :data:`SKEW_S` (``expired``, ``not_yet_valid``);
3. it carries a proof (``no_proof``) made for this spoke (``wrong_target``), within
   :data:`PROOF_WINDOW_S` of this spoke's clock (``stale_proof``), signed by the grant's
   holder key over this call (``bad_proof``);
4. the proof's nonce was not seen before (``replayed``; kept for twice the window). Nonces
   that could still be replayed are never forgotten, so the cache refuses (``busy``)
   rather than grow past its bounds, fairly: a caller with :data:`REPLAY_PER_HOLDER`
   nonces remembered is refused, whoever else calls; past :data:`REPLAY_CAPACITY` in
   all, only callers above their fair share (the capacity over the callers remembered)
   are; and nothing past twice the capacity. So a caller making calls as fast as it can
   refuses itself, not the region. A caller is the grant's subject (the hub's name for
   its token), not its holder key: a token holder can mint as many grants, hence holder
   keys, as it likes, but not subjects (:func:`caller_of`).

After DPoP (RFC 9449 §4.3 and §11.1: the proof's time window and a replay cache of its
``jti``). Grant signatures already verified are remembered (:data:`GRANT_CACHE`), so a
call costs one Ed25519 verification (the proof's), about 0.1 ms.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from google.protobuf.message import DecodeError

from protocol.grants import (
    GRANT_METADATA,
    NONCE_BYTES,
    PROOF_METADATA,
    PUBLIC_KEY_BYTES,
    grant_message,
    proof_message,
)
from protocol.hub.v1 import hub_pb2
from protocol.spoke.v1 import peer_pb2
from spoke.mesh.grants import HubGrantKeys


def caller_of(claims: hub_pb2.GrantClaims) -> str:
    """Who a call is from, for every per-caller allowance at this owner (calls, bytes,
    memory, the replay cache's share, hint loads): the subject the hub signed into the
    grant, the name of the token it was issued to.

    Not the holder key, nor the node name: the caller chooses both in ``IssueGrant`` (the
    hub checks only their form), so one token could mint a grant per allowance it wants.
    The spokes of a region that share one hub token are one caller at each owner; each
    spoke its own token (``strata-hub token create``) gives each its own allowance.
    """
    return claims.subject


SKEW_S = 5.0
"""Clock difference allowed between the hub and this spoke for a grant's times, seconds."""

PROOF_WINDOW_S = 30.0
"""How far a proof's time may be from this spoke's clock, seconds."""

REPLAY_CAPACITY = 1 << 17
"""Proof nonces remembered (each for ``2 * PROOF_WINDOW_S``) before callers above their
fair share are refused; twice as many at most."""

REPLAY_PER_HOLDER = 1 << 14
"""Most proof nonces remembered for one caller (subject): 273 calls a second to this
spoke, sustained, from every spoke of the region that shares the subject's token (a
spoke's scheduler opens at most 16 streams at once, over all owners)."""

GRANT_CACHE = 4096
"""Grant signatures remembered as verified."""


class GrantRefused(Exception):
    """A call's grant or proof was refused; ``reason`` is the metric label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class ReplayCache:
    """Nonces seen in the last ``ttl_s`` seconds (arrival order is expiry order), counted
    per caller (a grant's subject) so that one caller filling it refuses only itself.

    Args:
        ttl_s: how long a nonce is remembered, seconds.
        capacity: nonces remembered before callers above their fair share are refused;
            never more than twice this.
        per_holder: most nonces remembered for one caller.
        now: the monotonic clock.
    """

    def __init__(
        self,
        ttl_s: float,
        capacity: int,
        per_holder: int | None = None,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.capacity = capacity
        self.per_holder = per_holder if per_holder is not None else capacity
        self._now = now
        self._seen: OrderedDict[bytes, tuple[float, str]] = OrderedDict()
        self._held: dict[str, int] = {}  # nonces remembered, by caller

    def __len__(self) -> int:
        return len(self._seen)

    def held(self, caller: str) -> int:
        """Nonces remembered for ``caller``."""
        return self._held.get(caller, 0)

    def add(self, nonce: bytes, caller: str = "") -> None:
        """Remember ``nonce`` of ``caller``'s proof.

        Raises:
            GrantRefused: seen before (``replayed``), or ``caller`` has used its share of
                the cache (``busy``).
        """
        now = self._now()
        while self._seen:
            oldest, (until, who) = next(iter(self._seen.items()))
            if until > now:
                break
            del self._seen[oldest]
            left = self._held[who] - 1
            if left:
                self._held[who] = left
            else:
                del self._held[who]
        if nonce in self._seen:
            raise GrantRefused("replayed", "this proof was used before")
        mine, total = self.held(caller), len(self._seen)
        fair = self.capacity // max(len(self._held), 1)
        if (
            mine >= self.per_holder
            or (total >= self.capacity and mine >= fair)
            or total >= 2 * self.capacity
        ):
            raise GrantRefused(
                "busy", f"this caller made {mine} calls here in {self.ttl_s:g} s; try again"
            )
        self._seen[nonce] = (now + self.ttl_s, caller)
        self._held[caller] = mine + 1


def _first(metadata: Iterable[tuple[str, str | bytes]], key: str) -> bytes | None:
    for name, value in metadata:
        if name == key:
            return value if isinstance(value, bytes) else value.encode()
    return None


class GrantVerifier:
    """Checks grants and proofs for calls to this spoke.

    Args:
        node: this spoke's mesh node name (what proofs must name).
        keys: the hub's grant keys.
        wall_ns: the wall clock, ns since the epoch; ``mono`` the monotonic one
            (both injectable for tests).
    """

    def __init__(
        self,
        node: str,
        keys: HubGrantKeys,
        wall_ns: Callable[[], int] = time.time_ns,
        mono: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node = node
        self.keys = keys
        self._wall_ns = wall_ns
        self.replays = ReplayCache(2 * PROOF_WINDOW_S, REPLAY_CAPACITY, REPLAY_PER_HOLDER, mono)
        self._verified: OrderedDict[bytes, tuple[bytes, hub_pb2.GrantClaims]] = OrderedDict()

    def verify(
        self, metadata: Iterable[tuple[str, str | bytes]], method: str
    ) -> hub_pb2.GrantClaims:
        """The claims of the call's grant, once grant and proof pass every check.

        Args:
            metadata: the call's invocation metadata.
            method: the RPC's name (``ReadBlocks``).

        Raises:
            GrantRefused: a check failed (its ``reason`` says which).
        """
        pairs = list(metadata)
        raw_grant = _first(pairs, GRANT_METADATA)
        if raw_grant is None:
            raise GrantRefused("no_grant", "no read grant: the caller has none from the hub")
        signed, claims = self._claims(raw_grant)
        now = self._wall_ns()
        skew = int(SKEW_S * 1e9)
        if now > claims.expires_ns + skew:
            age = (now - claims.expires_ns) / 1e9
            raise GrantRefused("expired", f"grant {claims.grant_id} expired {age:.1f} s ago")
        if claims.issued_ns > now + skew:
            raise GrantRefused("not_yet_valid", f"grant {claims.grant_id} is from the future")
        raw_proof = _first(pairs, PROOF_METADATA)
        if raw_proof is None:
            raise GrantRefused("no_proof", "a grant without a proof of possession")
        try:
            proof = peer_pb2.PeerProof.FromString(raw_proof)
        except DecodeError:
            raise GrantRefused("malformed", "the proof does not parse") from None
        if proof.target != self.node:
            raise GrantRefused(
                "wrong_target", f"the proof is for {proof.target!r}, this is {self.node}"
            )
        if abs(now - proof.time_ns) > int(PROOF_WINDOW_S * 1e9):
            drift = (now - proof.time_ns) / 1e9
            raise GrantRefused("stale_proof", f"the proof is {drift:+.1f} s off this clock")
        if len(proof.nonce) != NONCE_BYTES or len(claims.holder_key) != PUBLIC_KEY_BYTES:
            raise GrantRefused("malformed", "a proof nonce or holder key of the wrong size")
        try:
            holder = Ed25519PublicKey.from_public_bytes(claims.holder_key)
            holder.verify(
                proof.signature,
                proof_message(self.node, method, proof.time_ns, proof.nonce, signed),
            )
        except (InvalidSignature, ValueError):
            raise GrantRefused(
                "bad_proof", "the proof is not signed by the grant's holder"
            ) from None
        self.replays.add(proof.nonce, caller_of(claims))
        return claims

    def _claims(self, raw_grant: bytes) -> tuple[bytes, hub_pb2.GrantClaims]:
        """The signed claims bytes of a grant and their parse, once its signature verifies."""
        try:
            grant = hub_pb2.ReadGrant.FromString(raw_grant)
        except DecodeError:
            raise GrantRefused("malformed", "the grant does not parse") from None
        known = self._verified.get(grant.signature)
        if known is not None and grant.claims == known[0]:
            self._verified.move_to_end(grant.signature)
            return known
        key = self.keys.get(grant.key_id)
        if key is None:
            raise GrantRefused("unknown_key", f"grant signed by unknown hub key {grant.key_id!r}")
        try:
            key.verify(grant.signature, grant_message(grant.claims))
        except InvalidSignature:
            raise GrantRefused(
                "bad_signature", "the grant's hub signature does not verify"
            ) from None
        try:
            claims = hub_pb2.GrantClaims.FromString(grant.claims)
        except DecodeError:
            raise GrantRefused("malformed", "the grant's claims do not parse") from None
        if claims.key_id != grant.key_id:
            raise GrantRefused("malformed", "the grant names two different keys")
        self._verified[grant.signature] = (grant.claims, claims)
        if len(self._verified) > GRANT_CACHE:
            self._verified.popitem(last=False)
        return grant.claims, claims
