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

**The peer variant** (a region's spokes, ``spoke serve --peer-bulk-port``) carries what
the gRPC peer call ``SpokePeer.ReadBlocks`` carries, in one self-delimiting request::

    magic    4 bytes   b"SBP1"
    length   u32       bytes of the body that follows (at most MAX_PEER_REQUEST_BYTES)
    body:
      token      u16 length, then the region's token (UTF-8; length 0: none)
      grant      u16 length, then the hub-signed read grant (the gRPC call's
                 ``strata-grant-bin`` bytes; length 0: none)
      proof      u16 length, then the proof of possession made for the owner's mesh
                 name and ``ReadBlocks`` (``strata-proof-bin``; length 0: none)
      class      u8 length, then the request class label (ASCII: demand, peer, …)
      blocks     u16 count, then count x (16 bytes digest, u32 size): the asker's sizes
      snapshots  u8 count (at most MAX_SNAPSHOTS), then each as three u8-length UTF-8
                 strings: dataset, version, snapshot id (the owner's load hint)

Its reply starts with one **declined frame** (what gRPC puts in the initial metadata)::

    code     u8        DECLINED (255)
    16 zero bytes, u32 count, then count x 16 bytes: the digests the owner will not
    serve (the asker gets them from the hub)

then one OK frame (as above) per block not declined, in request order. An error frame may
stand in place of the declined frame (the call was refused: the gRPC path's status, the
same checks in the same order) or of any block (the owner's fetch of it failed); the
connection is then closed. Hub-bulk frames are unchanged: a hub never sends DECLINED.
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
"""Most digests one request may name (as ``hub.serve.blockstream.MAX_DIGESTS_PER_REQUEST``)."""

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


PEER_MAGIC = b"SBP1"
"""The first bytes of every peer request (the version, as :data:`MAGIC`)."""

PEER_HEAD = struct.Struct(">4sI")
"""magic, body length: the first 8 bytes of a peer request."""

MAX_PEER_REQUEST_BYTES = 64 << 10
"""Longest peer request body, bytes (the gRPC peer port's receive limit)."""

MAX_GRANT_BYTES = 4096
"""Longest grant or proof a peer request may carry, bytes (each is about 200)."""

MAX_SNAPSHOTS = 16
"""Most snapshots a peer request names (the owner looks at the first 8)."""

DECLINED = 255
"""The code of a peer reply's declined frame."""

_BLOCK_REF = struct.Struct(">16sI")
_U8 = struct.Struct(">B")


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


@dataclass(frozen=True, slots=True)
class PeerRequest:
    """One peer request: the region's token, the grant and proof (raw bytes; empty:
    none), the request class, ``(digest, size)`` asked for, and ``(dataset, version,
    snapshot id)`` hints."""

    token: str
    grant: bytes
    proof: bytes
    request_class: str
    blocks: tuple[tuple[str, int], ...]
    snapshots: tuple[tuple[str, str, str], ...] = ()


def encode_peer_request(request: PeerRequest) -> bytes:
    """A peer request's bytes (snapshots past :data:`MAX_SNAPSHOTS` left out, names cut
    to 255 bytes).

    Raises:
        BulkProtocolError: a token, grant or proof too long, more than
            :data:`MAX_DIGESTS` blocks, a malformed digest or a size over
            :data:`MAX_BLOCK_BYTES`, or a body over :data:`MAX_PEER_REQUEST_BYTES`.
    """
    token = request.token.encode("utf-8")
    if len(token) > MAX_TOKEN_BYTES:
        raise BulkProtocolError(f"token of {len(token)} bytes; at most {MAX_TOKEN_BYTES}")
    for name, raw in (("grant", request.grant), ("proof", request.proof)):
        if len(raw) > MAX_GRANT_BYTES:
            raise BulkProtocolError(f"{name} of {len(raw)} bytes; at most {MAX_GRANT_BYTES}")
    if len(request.blocks) > MAX_DIGESTS:
        raise BulkProtocolError(
            f"{len(request.blocks)} blocks in one request; at most {MAX_DIGESTS}"
        )
    label = request.request_class.encode("ascii", "replace")[:255]
    parts = [COUNT.pack(len(token)), token, COUNT.pack(len(request.grant)), request.grant]
    parts += [COUNT.pack(len(request.proof)), request.proof, _U8.pack(len(label)), label]
    parts.append(COUNT.pack(len(request.blocks)))
    try:
        for digest, size in request.blocks:
            if not 0 <= size <= MAX_BLOCK_BYTES:
                raise ValueError(f"a block of {size} bytes; at most {MAX_BLOCK_BYTES}")
            parts.append(_BLOCK_REF.pack(_raw_digest(digest), size))
    except ValueError as err:
        raise BulkProtocolError(str(err)) from None
    snapshots = request.snapshots[:MAX_SNAPSHOTS]
    parts.append(_U8.pack(len(snapshots)))
    for names in snapshots:
        for name in names:
            raw = name.encode("utf-8")[:255]
            parts += [_U8.pack(len(raw)), raw]
    body = b"".join(parts)
    if len(body) > MAX_PEER_REQUEST_BYTES:
        raise BulkProtocolError(f"a request of {len(body)} bytes; at most {MAX_PEER_REQUEST_BYTES}")
    return PEER_HEAD.pack(PEER_MAGIC, len(body)) + body


def parse_peer_head(head: bytes) -> int:
    """The body length a peer request's first :data:`PEER_HEAD` bytes announce.

    Raises:
        BulkProtocolError: wrong magic, or a body over :data:`MAX_PEER_REQUEST_BYTES`.
    """
    magic, length = PEER_HEAD.unpack(head)
    if magic != PEER_MAGIC:
        raise BulkProtocolError(f"not a peer bulk request (starts {magic!r}, not {PEER_MAGIC!r})")
    if length > MAX_PEER_REQUEST_BYTES:
        raise BulkProtocolError(f"a request of {length} bytes; at most {MAX_PEER_REQUEST_BYTES}")
    return int(length)


class _Body:
    """Reads a peer request's body field by field."""

    def __init__(self, raw: bytes) -> None:
        self.raw, self.at = raw, 0

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.raw):
            raise BulkProtocolError(f"a request cut short at byte {self.at} of {len(self.raw)}")
        self.at += n
        return self.raw[self.at - n : self.at]

    def u8(self) -> int:
        return int(self.take(1)[0])

    def u16(self) -> int:
        return int(COUNT.unpack(self.take(2))[0])

    def string(self, length: int, what: str) -> str:
        try:
            return self.take(length).decode("utf-8")
        except UnicodeDecodeError:
            raise BulkProtocolError(f"a {what} that is not UTF-8") from None


def parse_peer_request(body: bytes) -> PeerRequest:
    """A peer request from its body (the bytes after :data:`PEER_HEAD`).

    Raises:
        BulkProtocolError: a field cut short or over its limit, a size over
            :data:`MAX_BLOCK_BYTES`, or bytes after the last field.
    """
    b = _Body(body)
    token_len = b.u16()
    if token_len > MAX_TOKEN_BYTES:
        raise BulkProtocolError(f"token of {token_len} bytes; at most {MAX_TOKEN_BYTES}")
    token = b.take(token_len).decode("utf-8", "replace")
    grant, proof = b.take(b.u16()), b.take(b.u16())
    if max(len(grant), len(proof)) > MAX_GRANT_BYTES:
        raise BulkProtocolError(f"a grant or proof over {MAX_GRANT_BYTES} bytes")
    label = b.string(b.u8(), "request class")
    count = b.u16()
    if count > MAX_DIGESTS:
        raise BulkProtocolError(f"{count} blocks in one request; at most {MAX_DIGESTS}")
    blocks = []
    for _ in range(count):
        raw, size = _BLOCK_REF.unpack(b.take(_BLOCK_REF.size))
        if size > MAX_BLOCK_BYTES:
            raise BulkProtocolError(f"a block of {size} bytes; at most {MAX_BLOCK_BYTES}")
        blocks.append((bytes(raw).hex(), int(size)))
    nsnap = b.u8()
    if nsnap > MAX_SNAPSHOTS:
        raise BulkProtocolError(f"{nsnap} snapshots in one request; at most {MAX_SNAPSHOTS}")
    snapshots = []
    for _ in range(nsnap):
        dataset, version, sid = (b.string(b.u8(), "snapshot name") for _ in range(3))
        snapshots.append((dataset, version, sid))
    if b.at != len(body):
        raise BulkProtocolError(f"{len(body) - b.at} bytes after the request's last field")
    return PeerRequest(token, grant, proof, label, tuple(blocks), tuple(snapshots))


def encode_declined(digests: list[str] | tuple[str, ...]) -> bytes:
    """A peer reply's declined frame for ``digests`` (32 hex characters each; at most
    :data:`MAX_DIGESTS`)."""
    return BLOCK_HEAD.pack(DECLINED, bytes(16), len(digests)) + b"".join(
        bytes.fromhex(d) for d in digests
    )


def parse_peer_reply_head(head: bytes | bytearray | memoryview) -> tuple[int, str, int]:
    """As :func:`parse_block_head` for a peer reply, which may also be the declined
    frame: ``(DECLINED, "", count)``, ``count`` x 16 bytes of digests following.

    Raises:
        BulkProtocolError: as :func:`parse_block_head`, or a count over :data:`MAX_DIGESTS`.
    """
    if head[0] != DECLINED:
        return parse_block_head(head)
    _, _, count = BLOCK_HEAD.unpack(head)
    if count > MAX_DIGESTS:
        raise BulkProtocolError(f"{count} declined digests; at most {MAX_DIGESTS}")
    return DECLINED, "", int(count)
