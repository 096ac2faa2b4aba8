"""What read grants and peer proofs sign, and how a grant's scopes match a dataset.

A **read grant** is the hub's Ed25519 (RFC 8032) signature of
``b"strata-read-grant\\0" | format u16 (=1) | claims``, where ``claims`` is a serialized
``protocol.hub.v1.GrantClaims`` (subject, dataset scopes, holder key, node, issue and
expiry times): the signature covers the very bytes a verifier then parses, so no canonical
re-encoding is needed (as JWS signs its encoded payload, RFC 7515 §5.2).

A **proof** is the holder key's signature of ``b"strata-peer-proof\\0" | format u16 (=1) |
target | NUL | method | NUL | time_ns i64 | nonce (16 bytes) | SHA-256(claims)``: proof of
possession of the key the grant names, for one call to one spoke (the target's mesh node
name), at one time, once (the nonce), after OAuth DPoP (RFC 9449 §4.2: ``htm``, ``htu``,
``iat``, ``jti``, ``ath``). A spoke that receives a grant cannot use it anywhere: it lacks
the holder's private key, and the proof it saw names itself as the target.

Metadata keys (binary, so gRPC base64-encodes them on the wire): :data:`GRANT_METADATA`,
:data:`PROOF_METADATA`, and the owner's answer :data:`DECLINED_METADATA`.
"""

from __future__ import annotations

import fnmatch
import hashlib
import struct
from collections.abc import Iterable

FORMAT = 1
_GRANT_HEADER = b"strata-read-grant\0" + struct.pack(">H", FORMAT)
_PROOF_HEADER = b"strata-peer-proof\0" + struct.pack(">H", FORMAT)
_TIME = struct.Struct(">q")

GRANT_METADATA = "strata-grant-bin"
"""Call metadata carrying a serialized ``ReadGrant``."""

PROOF_METADATA = "strata-proof-bin"
"""Call metadata carrying a serialized ``PeerProof``."""

DECLINED_METADATA = "strata-declined-bin"
"""Initial response metadata of a peer's ReadBlocks: the digests it will not serve, 16 raw
bytes each, concatenated."""

NONCE_BYTES = 16
PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64


def grant_message(claims: bytes) -> bytes:
    """The bytes the hub signs for a grant whose serialized ``GrantClaims`` is ``claims``."""
    return _GRANT_HEADER + claims


def proof_message(target: str, method: str, time_ns: int, nonce: bytes, claims: bytes) -> bytes:
    """The bytes a grant's holder signs for one call.

    Args:
        target: the mesh node name (``HOST:PORT``) of the spoke called.
        method: the RPC's name, e.g. ``ReadBlocks``.
        time_ns: when the proof was made, nanoseconds since the Unix epoch.
        nonce: :data:`NONCE_BYTES` random bytes.
        claims: the grant's serialized claims (the proof is bound to that grant).

    Raises:
        ValueError: a name holds a NUL, or the nonce has the wrong length.
    """
    if "\0" in target or "\0" in method:
        raise ValueError("node and method names never hold NUL")
    if len(nonce) != NONCE_BYTES:
        raise ValueError(f"a proof nonce is {NONCE_BYTES} bytes, not {len(nonce)}")
    return b"".join(
        (
            _PROOF_HEADER,
            target.encode(),
            b"\0",
            method.encode(),
            b"\0",
            _TIME.pack(time_ns),
            nonce,
            hashlib.sha256(claims).digest(),
        )
    )


def key_id(public_key: bytes) -> str:
    """The id of a grant-signing public key: the first 16 hex digits of its SHA-256."""
    return hashlib.sha256(public_key).hexdigest()[:16]


def covers(scopes: Iterable[str], dataset: str) -> bool:
    """Whether dataset globs ``scopes`` cover ``dataset`` (``fnmatchcase``, exactly as the
    hub matches a token's scopes, ``hub.auth.tokens.Principal.may_read``)."""
    return any(fnmatch.fnmatchcase(dataset, scope) for scope in scopes)
