"""The bulk block channel: whole blocks over one TCP (or TLS) connection, beside gRPC.

gRPC stays the control plane (resolve, manifests, grants, watch). Block bytes can take
this channel instead of ``Hub.ReadBlocks``: its frames are a fixed header and the block's
bytes as they are on disk, so the hub can hand a blob file to ``sendfile(2)`` and the
spoke can ``recv_into`` a buffer it reuses. grpcio's Python layer copies each received
message twice (grpc/grpc#42287); no locked release has a zero-copy receive, so the bytes
leave gRPC (``bench.ingest`` has the figures).

Every integer is big-endian. One connection carries requests one after another; each
is answered in full before the next is read.

A **request** (client to server)::

    magic    4 bytes   b"SBK1"
    token    u16 length, then that many bytes (UTF-8; length 0: no token)
    digests  u16 count, then count x 16 bytes (xxh3-128, raw)

A **reply** is one frame per requested digest, in request order::

    code     u8        0 (OK) or a gRPC status code (see STATUS_NAMES)
    OK:      digest 16 bytes, size u32, then size bytes of the block
    error:   u16 length, 18 zero bytes (every frame's head is 21 bytes), then that
             many bytes of UTF-8 message

After an error frame the server closes the connection: the blocks after it are not sent.
The checks are the gRPC path's, with its status codes: no or a bad token is
UNAUTHENTICATED, a block of no dataset the token may read NOT_FOUND, a request over the
limits INVALID_ARGUMENT or RESOURCE_EXHAUSTED.

Under TLS the ALPN protocol is :data:`ALPN`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = b"SBK1"
"""The first bytes of every request (the version: a later one gets a new magic)."""

ALPN = "strata-bulk/1"
"""The TLS ALPN protocol name of this channel."""

MAX_TOKEN_BYTES = 4096
"""Longest token a request may carry, bytes."""

MAX_DIGESTS = 512
"""Most digests one request may name (as ``hub.blockstream.MAX_DIGESTS_PER_REQUEST``)."""

MAX_BLOCK_BYTES = 1 << 30
"""Largest block size a reply frame may announce, bytes (blocks are at most 64 MiB; a
larger size is a broken or hostile peer, not a block)."""

MAX_MESSAGE_BYTES = 4096
"""Longest error message in an error frame, bytes (longer ones are cut)."""

OK = 0
STATUS_NAMES = {
    3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND",
    7: "PERMISSION_DENIED",
    8: "RESOURCE_EXHAUSTED",
    13: "INTERNAL",
    14: "UNAVAILABLE",
    15: "DATA_LOSS",
    16: "UNAUTHENTICATED",
}
"""The gRPC status codes (``grpc.StatusCode``'s numbers) an error frame may carry."""

REQUEST_HEAD = struct.Struct(">4sH")
"""magic, token length."""
COUNT = struct.Struct(">H")
BLOCK_HEAD = struct.Struct(">B16sI")
"""code 0, digest, size: the start of an OK frame (21 bytes)."""
ERROR_HEAD = struct.Struct(">BH18x")
"""code, message length, padding: the head of an error frame (21 bytes, as an OK one)."""


class BulkProtocolError(ValueError):
    """Bytes that are not this protocol (the message says which part)."""


@dataclass(frozen=True, slots=True)
class BulkRequest:
    """One request: the caller's token (empty: none) and the digests it asks for, as
    32-character hex strings."""

    token: str
    digests: tuple[str, ...]


def encode_request(token: str, digests: list[str] | tuple[str, ...]) -> bytes:
    """A request's bytes.

    Raises:
        BulkProtocolError: the token is longer than :data:`MAX_TOKEN_BYTES`, more than
            :data:`MAX_DIGESTS` digests, or a digest is not 32 hex characters.
    """
    raw_token = token.encode("utf-8")
    if len(raw_token) > MAX_TOKEN_BYTES:
        raise BulkProtocolError(f"token of {len(raw_token)} bytes; at most {MAX_TOKEN_BYTES}")
    if len(digests) > MAX_DIGESTS:
        raise BulkProtocolError(f"{len(digests)} digests in one request; at most {MAX_DIGESTS}")
    try:
        raw = b"".join(_raw_digest(d) for d in digests)
    except ValueError as err:
        raise BulkProtocolError(str(err)) from None
    return b"".join(
        (REQUEST_HEAD.pack(MAGIC, len(raw_token)), raw_token, COUNT.pack(len(digests)), raw)
    )


def _raw_digest(digest: str) -> bytes:
    try:
        raw = bytes.fromhex(digest) if len(digest) == 32 else b""
    except ValueError:
        raw = b""
    if len(raw) != 16:
        raise ValueError(f"not a block digest (32 hex characters): {digest[:80]!r}")
    return raw


def parse_request_head(head: bytes) -> int:
    """The token length announced by a request's first :data:`REQUEST_HEAD` bytes.

    Raises:
        BulkProtocolError: wrong magic, or a token longer than :data:`MAX_TOKEN_BYTES`.
    """
    magic, token_len = REQUEST_HEAD.unpack(head)
    if magic != MAGIC:
        raise BulkProtocolError(f"not a bulk request (starts {magic!r}, not {MAGIC!r})")
    if token_len > MAX_TOKEN_BYTES:
        raise BulkProtocolError(f"token of {token_len} bytes; at most {MAX_TOKEN_BYTES}")
    return int(token_len)


def parse_count(raw: bytes) -> int:
    """The digest count of a request.

    Raises:
        BulkProtocolError: more than :data:`MAX_DIGESTS`, or none.
    """
    (count,) = COUNT.unpack(raw)
    if not 0 < count <= MAX_DIGESTS:
        raise BulkProtocolError(f"{count} digests in one request; 1 to {MAX_DIGESTS} are allowed")
    return int(count)


def split_digests(raw: bytes) -> tuple[str, ...]:
    """Hex digests of a request's raw digest bytes (16 each)."""
    return tuple(raw[i : i + 16].hex() for i in range(0, len(raw), 16))


def encode_block_head(digest: str, size: int) -> bytes:
    """The 21 bytes before a block's bytes in an OK frame."""
    return BLOCK_HEAD.pack(OK, bytes.fromhex(digest), size)


def encode_error(code: int, message: str) -> bytes:
    """An error frame (the message cut to :data:`MAX_MESSAGE_BYTES`).

    Raises:
        ValueError: ``code`` is not one of :data:`STATUS_NAMES`.
    """
    if code not in STATUS_NAMES:
        raise ValueError(f"not an error code of this protocol: {code}")
    raw = message.encode("utf-8")[:MAX_MESSAGE_BYTES]
    return ERROR_HEAD.pack(code, len(raw)) + raw


def parse_block_head(head: bytes | bytearray | memoryview) -> tuple[int, str, int]:
    """``(code, digest, size)`` of an OK frame's first :data:`BLOCK_HEAD` bytes; for an
    error frame ``(code, "", message length)``, whose message follows.

    Raises:
        BulkProtocolError: an unknown code, or a size over :data:`MAX_BLOCK_BYTES`.
    """
    code = head[0]
    if code == OK:
        _, raw, size = BLOCK_HEAD.unpack(head)
        if size > MAX_BLOCK_BYTES:
            raise BulkProtocolError(f"a block of {size} bytes announced; at most {MAX_BLOCK_BYTES}")
        return OK, bytes(raw).hex(), int(size)
    if code not in STATUS_NAMES:
        raise BulkProtocolError(f"unknown reply code {code}")
    _, length = ERROR_HEAD.unpack(head)
    if length > MAX_MESSAGE_BYTES:
        raise BulkProtocolError(f"an error message of {length} bytes; at most {MAX_MESSAGE_BYTES}")
    return int(code), "", int(length)
