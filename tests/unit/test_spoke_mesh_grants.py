"""Read grants end to end without the network: the hub's issuer signs, a spoke's keeper
holds the grant and makes proofs, another spoke's verifier checks them. Every refusal
reason is reached, and a grant that passes gives back exactly what the hub issued."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Sequence

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hub.auth.grants import GrantIssuer
from hub.auth.tokens import Principal
from hub.errors import ConfigError, InvalidArgument
from protocol.grants import GRANT_METADATA, PROOF_METADATA, covers, proof_message
from protocol.hub.v1 import hub_pb2
from protocol.spoke.v1 import peer_pb2
from spoke.mesh.grantcheck import (
    PROOF_WINDOW_S,
    SKEW_S,
    GrantRefused,
    GrantVerifier,
    ReplayCache,
)
from spoke.mesh.grants import GrantKeeper, HubGrantKeys

ALICE = Principal("tok-alice", ("a", "a-*"))
OWNER = "127.0.0.1:7001"
OTHER = "127.0.0.1:7002"
T0 = 1_800_000_000 * 10**9  # the shared wall clock, ns


class Clock:
    """A wall clock (ns) and a monotonic one (s) that tests move by hand."""

    def __init__(self) -> None:
        self.ns = T0
        self.mono = 1000.0

    def wall(self) -> int:
        return self.ns

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.ns += int(seconds * 1e9)
        self.mono += seconds


class IssuingHub:
    """The two hub calls a keeper makes, answered by a real issuer."""

    def __init__(self, issuer: GrantIssuer, principal: Principal = ALICE) -> None:
        self.issuer = issuer
        self.principal = principal

    async def issue_grant(self, holder_key: bytes, node: str) -> hub_pb2.ReadGrant:
        request = hub_pb2.IssueGrantRequest(holder_key=holder_key, node=node)
        return self.issuer.issue(self.principal, request)

    async def grant_keys(self) -> hub_pb2.GrantKeysResponse:
        return self.issuer.keys()


def _setup(clock: Clock, lifetime: float = 120.0) -> tuple[GrantIssuer, GrantKeeper, GrantVerifier]:
    issuer = GrantIssuer(Ed25519PrivateKey.generate(), lifetime, now_ns=clock.wall)
    hub = IssuingHub(issuer)
    keys = HubGrantKeys(hub, now=clock.monotonic)  # type: ignore[arg-type]
    keeper = GrantKeeper(hub, OTHER, keys, mono=clock.monotonic, wall_ns=clock.wall)  # type: ignore[arg-type]
    asyncio.run(keeper.fetch())
    verifier = GrantVerifier(OWNER, keys, wall_ns=clock.wall, mono=clock.monotonic)
    return issuer, keeper, verifier


def _reason(verifier: GrantVerifier, metadata: Sequence[tuple[str, bytes]]) -> str:
    with pytest.raises(GrantRefused) as refused:
        verifier.verify(metadata, "ReadBlocks")
    return refused.value.reason


def test_a_grant_and_its_proof_verify_to_what_the_hub_issued() -> None:
    clock = Clock()
    _, keeper, verifier = _setup(clock)
    claims = verifier.verify(keeper.metadata(OWNER, "ReadBlocks"), "ReadBlocks")
    assert claims.subject == "tok-alice" and list(claims.scopes) == ["a", "a-*"]
    assert claims.node == OTHER and claims.holder_key == keeper.holder_key
    assert claims.expires_ns - claims.issued_ns == 120 * 10**9
    assert covers(claims.scopes, "a-2") and not covers(claims.scopes, "b")


def test_an_expired_grant_is_refused_after_the_skew() -> None:
    clock = Clock()
    _, keeper, verifier = _setup(clock, lifetime=10)
    assert keeper.valid and keeper.metadata(OWNER, "ReadBlocks")
    clock.advance(10 + SKEW_S - 0.5)  # expired, within the skew: still accepted
    verifier.verify(keeper_proof(keeper, OWNER, clock), "ReadBlocks")
    clock.advance(1.0)
    assert _reason(verifier, keeper_proof(keeper, OWNER, clock)) == "expired"
    # the keeper itself stopped showing it before it expired
    assert not keeper.valid and keeper.metadata(OWNER, "ReadBlocks") == ()


def keeper_proof(keeper: GrantKeeper, target: str, clock: Clock) -> tuple[tuple[str, bytes], ...]:
    """A fresh proof for the keeper's grant even once the keeper would not show it."""
    assert keeper.grant is not None
    nonce = clock.ns.to_bytes(16, "big")
    message = proof_message(target, "ReadBlocks", clock.ns, nonce, keeper.grant.claims)
    signature = keeper._holder.sign(message)
    proof = peer_pb2.PeerProof(time_ns=clock.ns, nonce=nonce, signature=signature, target=target)
    return (
        (GRANT_METADATA, keeper.grant.SerializeToString()),
        (PROOF_METADATA, proof.SerializeToString()),
    )


def test_a_changed_claim_breaks_the_hub_signature() -> None:
    clock = Clock()
    _, keeper, verifier = _setup(clock)
    assert keeper.grant is not None
    claims = hub_pb2.GrantClaims.FromString(keeper.grant.claims)
    claims.scopes.append("b")  # the holder widens its own grant
    forged = hub_pb2.ReadGrant(
        claims=claims.SerializeToString(),
        signature=keeper.grant.signature,
        key_id=keeper.grant.key_id,
    )
    proof = dict(keeper.metadata(OWNER, "ReadBlocks"))[PROOF_METADATA]
    metadata = ((GRANT_METADATA, forged.SerializeToString()), (PROOF_METADATA, proof))
    assert _reason(verifier, metadata) == "bad_signature"


def test_a_grant_from_a_foreign_key_is_refused() -> None:
    clock = Clock()
    _, keeper, verifier = _setup(clock)
    rogue = GrantIssuer(Ed25519PrivateKey.generate(), now_ns=clock.wall)
    hub = IssuingHub(rogue, Principal("root", ("*",)))
    stranger = GrantKeeper(hub, OTHER, mono=clock.monotonic, wall_ns=clock.wall)  # type: ignore[arg-type]
    asyncio.run(stranger.fetch())
    metadata = stranger.metadata(OWNER, "ReadBlocks")

    async def check() -> str:  # an unknown key id asks the hub for its keys again
        reason = _reason(verifier, metadata)
        await asyncio.sleep(0)
        return reason

    assert asyncio.run(check()) == "unknown_key"
    # the same rogue grant relabelled with the hub's key id: the signature gives it away
    assert stranger.grant is not None and keeper.grant is not None
    relabelled = hub_pb2.ReadGrant(
        claims=stranger.grant.claims, signature=stranger.grant.signature, key_id=keeper.grant.key_id
    )
    proof = dict(metadata)[PROOF_METADATA]
    forged = ((GRANT_METADATA, relabelled.SerializeToString()), (PROOF_METADATA, proof))
    assert _reason(verifier, forged) == "bad_signature"


def test_a_proof_for_another_spoke_is_refused() -> None:
    clock = Clock()
    _, keeper, verifier = _setup(clock)
    # what OTHER's peer port saw, replayed by it to OWNER
    seen = keeper.metadata(OTHER, "ReadBlocks")
    assert _reason(verifier, seen) == "wrong_target"
    # the same proof with its target field rewritten: not what the holder signed
    proof = peer_pb2.PeerProof.FromString(dict(seen)[PROOF_METADATA])
    proof.target = OWNER
    relabelled = (
        (GRANT_METADATA, dict(seen)[GRANT_METADATA]),
        (PROOF_METADATA, proof.SerializeToString()),
    )
    assert _reason(verifier, relabelled) == "bad_proof"


def test_a_stolen_grant_without_the_holder_key_is_refused() -> None:
    clock = Clock()
    _, keeper, verifier = _setup(clock)
    assert keeper.grant is not None
    thief = Ed25519PrivateKey.generate()
    nonce = b"\x01" * 16
    message = proof_message(OWNER, "ReadBlocks", clock.ns, nonce, keeper.grant.claims)
    proof = peer_pb2.PeerProof(
        time_ns=clock.ns, nonce=nonce, signature=thief.sign(message), target=OWNER
    )
    metadata = (
        (GRANT_METADATA, keeper.grant.SerializeToString()),
        (PROOF_METADATA, proof.SerializeToString()),
    )
    assert _reason(verifier, metadata) == "bad_proof"
    # nor is a proof for another method
    other = keeper.metadata(OWNER, "Probe")
    assert _reason(verifier, other) == "bad_proof"


def test_a_replayed_proof_is_refused_and_an_old_one_is_stale() -> None:
    clock = Clock()
    _, keeper, verifier = _setup(clock)
    metadata = keeper.metadata(OWNER, "ReadBlocks")
    verifier.verify(metadata, "ReadBlocks")
    assert _reason(verifier, metadata) == "replayed"
    old = keeper.metadata(OWNER, "ReadBlocks")
    clock.advance(PROOF_WINDOW_S + 1)
    assert _reason(verifier, old) == "stale_proof"
    fresh = keeper.metadata(OWNER, "ReadBlocks")
    verifier.verify(fresh, "ReadBlocks")  # the grant itself is still good


def test_missing_or_garbled_metadata() -> None:
    clock = Clock()
    _, keeper, verifier = _setup(clock)
    metadata = dict(keeper.metadata(OWNER, "ReadBlocks"))
    assert _reason(verifier, ()) == "no_grant"
    assert _reason(verifier, ((GRANT_METADATA, metadata[GRANT_METADATA]),)) == "no_proof"
    assert _reason(verifier, ((GRANT_METADATA, b"\xff\xff\xff"),)) == "malformed"
    garbled = ((GRANT_METADATA, metadata[GRANT_METADATA]), (PROOF_METADATA, b"\xff\xff"))
    assert _reason(verifier, garbled) == "malformed"


def test_the_replay_cache_forgets_in_time_and_refuses_when_full() -> None:
    clock = Clock()
    cache = ReplayCache(ttl_s=10, capacity=2, now=clock.monotonic)
    cache.add(b"a")
    cache.add(b"b")
    with pytest.raises(GrantRefused) as full:
        cache.add(b"c")
    assert full.value.reason == "busy"
    clock.advance(11)
    cache.add(b"a")  # forgotten after its time: fine again
    assert len(cache) == 1


def test_a_grant_ends_with_its_token_and_the_issuer_checks_its_input() -> None:
    clock = Clock()
    expires = datetime.datetime.fromtimestamp(T0 / 1e9 + 30, datetime.UTC)
    issuer = GrantIssuer(Ed25519PrivateKey.generate(), 120, now_ns=clock.wall)
    holder = Ed25519PrivateKey.generate().public_key().public_bytes_raw()
    short = issuer.issue(
        Principal("tok-short", ("a",), expires),
        hub_pb2.IssueGrantRequest(holder_key=holder, node=OTHER),
    )
    claims = hub_pb2.GrantClaims.FromString(short.claims)
    assert claims.expires_ns == int(expires.timestamp() * 1e9)
    with pytest.raises(InvalidArgument, match="holder_key"):
        issuer.issue(ALICE, hub_pb2.IssueGrantRequest(holder_key=b"short", node=OTHER))
    with pytest.raises(InvalidArgument, match="node"):
        issuer.issue(ALICE, hub_pb2.IssueGrantRequest(holder_key=holder, node="a b"))
    with pytest.raises(ConfigError, match="lifetime"):
        GrantIssuer(Ed25519PrivateKey.generate(), 3600)


def test_a_subject_that_fills_the_replay_cache_refuses_only_itself() -> None:
    clock = Clock()
    issuer = GrantIssuer(Ed25519PrivateKey.generate(), 120.0, now_ns=clock.wall)
    keys = HubGrantKeys(IssuingHub(issuer), now=clock.monotonic)  # type: ignore[arg-type]
    keepers = [  # three tokens (subjects), a grant each
        GrantKeeper(
            IssuingHub(issuer, Principal(f"tok-{i}", ("a",))),  # type: ignore[arg-type]
            f"127.0.0.1:{7100 + i}",
            keys,
            mono=clock.monotonic,
            wall_ns=clock.wall,
        )
        for i in range(3)
    ]
    for keeper in keepers:
        asyncio.run(keeper.fetch())
    flooder, polite, late = keepers
    verifier = GrantVerifier(OWNER, keys, wall_ns=clock.wall, mono=clock.monotonic)
    verifier.replays = ReplayCache(60.0, capacity=8, per_holder=5, now=clock.monotonic)

    def call(keeper: GrantKeeper) -> None:
        verifier.verify(keeper.metadata(OWNER, "ReadBlocks"), "ReadBlocks")

    for _ in range(5):
        call(flooder)
    assert _reason(verifier, flooder.metadata(OWNER, "ReadBlocks")) == "busy"
    for _ in range(3):  # the cache is full now (8): others under their fair share go on
        call(polite)
    call(late)  # past the capacity, a holder below its share (8 / 3) still gets in
    assert _reason(verifier, flooder.metadata(OWNER, "ReadBlocks")) == "busy"
    assert _reason(verifier, polite.metadata(OWNER, "ReadBlocks")) == "busy"  # at 3 >= 8 // 3
    clock.advance(61)  # every nonce forgotten in its time
    call(flooder)
    assert len(verifier.replays) == 1


def test_grants_minted_by_one_subject_share_its_replay_allowance() -> None:
    """A token holder minting a grant per holder key (and per made-up node name) is still
    one caller: its grants share the replay cache's share of that subject."""
    clock = Clock()
    issuer = GrantIssuer(Ed25519PrivateKey.generate(), 120.0, now_ns=clock.wall)
    hub = IssuingHub(issuer)
    keys = HubGrantKeys(hub, now=clock.monotonic)  # type: ignore[arg-type]
    minted = [
        GrantKeeper(hub, f"10.0.0.{i}:7000", keys, mono=clock.monotonic, wall_ns=clock.wall)  # type: ignore[arg-type]
        for i in range(8)
    ]
    for keeper in minted:
        asyncio.run(keeper.fetch())
    assert len({k.holder_key for k in minted}) == 8
    verifier = GrantVerifier(OWNER, keys, wall_ns=clock.wall, mono=clock.monotonic)
    verifier.replays = ReplayCache(60.0, capacity=64, per_holder=5, now=clock.monotonic)
    for keeper in minted[:5]:  # one call per grant: five of the subject's five
        verifier.verify(keeper.metadata(OWNER, "ReadBlocks"), "ReadBlocks")
    for keeper in minted:  # every grant of the subject is refused now, fresh ones too
        assert _reason(verifier, keeper.metadata(OWNER, "ReadBlocks")) == "busy"
    assert verifier.replays.held("tok-alice") == 5
    bob = GrantKeeper(
        IssuingHub(issuer, Principal("tok-bob", ("a",))),  # type: ignore[arg-type]
        OTHER,
        keys,
        mono=clock.monotonic,
        wall_ns=clock.wall,
    )
    asyncio.run(bob.fetch())
    verifier.verify(bob.metadata(OWNER, "ReadBlocks"), "ReadBlocks")  # bob's own share
