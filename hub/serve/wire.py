"""What crosses the hub's wire: status codes, messages, block chunks, page tokens, limits.

:func:`status_code` is the one place domain errors become gRPC status codes (gRPC's
status code guide, https://grpc.io/docs/guides/status-codes/). The converters turn
catalog records into ``protocol.hub.v1`` messages; :func:`encode_block_chunk` writes a
``BlockChunk`` without copying the block; page tokens are opaque to clients (AIP-158);
:class:`HubWire` refuses request messages over the configured size, so they get a
message and are counted. :mod:`hub.serve.service` uses all of them.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import struct
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass

import grpc

from hub.catalog import Catalog, Snapshot, Tag
from hub.catalog.events import Event, EventKind
from hub.errors import (
    AlreadyExists,
    CatalogUnavailable,
    Conflict,
    CorruptBlob,
    CorruptCatalog,
    HubError,
    InvalidArgument,
    LimitExceeded,
    NotFound,
    PermissionDenied,
    SequenceOutOfRange,
    StorageError,
    Unauthenticated,
)
from hub.snapshot.blocks import MiB
from hub.snapshot.manifest import EntryType, ManifestEntry
from protocol.hub.v1 import hub_pb2

SERVICE_NAME = hub_pb2.DESCRIPTOR.services_by_name["Hub"].full_name
"""``protocol.hub.v1.Hub``."""

CHUNK_BYTES = 1 * MiB
"""Largest ``BlockChunk.data`` sent, bytes; keeps every message far below the size limit."""

MAX_REQUEST_BYTES = 32 * 1024
"""Largest request message the hub reads, bytes; :class:`HubWire` refuses larger ones
(``RESOURCE_EXHAUSTED``, counted). The largest legal requests are far smaller: a
``ReadBlocksRequest`` of :data:`hub.serve.blockstream.MAX_DIGESTS_PER_REQUEST` (512) digests is
17.4 KB, a listing of a 4,095-byte path about 4.3 KB; a ``WatchRequest`` naming more than
about 490 datasets by name does not fit (watch them all, and filter)."""

CORE_REQUEST_BYTES = 64 * 1024
"""gRPC core's receive limit on the hub, bytes (``grpc.max_receive_message_length``):
HTTP/2's initial stream window (65,535 bytes, RFC 9113 section 6.9.2). gRPC core opens a
stream's window to the length a message declares once the server asks for that message,
when the length is within this limit, and refuses the call (``RESOURCE_EXHAUSTED``, not
counted by the hub) when it is over. So a request still arriving can make the hub hold no
more than the window every open stream has anyway: a 60 MiB declaration that never
finishes, which took 64 streams of one token to 3.3 GiB under a 64 MiB limit, is refused
after its first 64 KiB. What is between :data:`MAX_REQUEST_BYTES` and this is read and
refused by :class:`HubWire`, with a message, and counted."""


_STATUS_CODES: tuple[tuple[type[HubError], grpc.StatusCode], ...] = (
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (LimitExceeded, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (Conflict, grpc.StatusCode.FAILED_PRECONDITION),
    (SequenceOutOfRange, grpc.StatusCode.OUT_OF_RANGE),
    (CorruptBlob, grpc.StatusCode.DATA_LOSS),
    (CorruptCatalog, grpc.StatusCode.DATA_LOSS),
    (StorageError, grpc.StatusCode.UNAVAILABLE),
    (CatalogUnavailable, grpc.StatusCode.UNAVAILABLE),
)


def status_code(error: HubError) -> grpc.StatusCode:
    """Maps a domain error to the gRPC status code a client receives (the only place).

    Args:
        error: The error.

    Returns:
        ``INVALID_ARGUMENT`` for malformed input, ``NOT_FOUND`` for unknown (or revoked,
        or unreadable) datasets, refs, paths, snapshots and blocks,
        ``RESOURCE_EXHAUSTED`` for requests over a limit, ``UNAUTHENTICATED`` for a
        missing or unknown token, ``PERMISSION_DENIED`` for a dataset outside the token's
        scope, ``ALREADY_EXISTS`` for attempts to rewrite a version,
        ``FAILED_PRECONDITION`` for changes the catalog's state forbids, ``OUT_OF_RANGE``
        for a Watch resumed from a sequence number not kept, ``DATA_LOSS`` for corrupt
        stored data, ``UNAVAILABLE`` when the blob store or a shared catalog's engine
        fails, ``INTERNAL`` otherwise.
    """
    for error_type, code in _STATUS_CODES:
        if isinstance(error, error_type):
            return code
    return grpc.StatusCode.INTERNAL


@dataclass(frozen=True, slots=True)
class Oversize:
    """Stands in for a request message over the size limit (see :class:`HubWire`).

    Attributes:
        size: The message's length, bytes.
        limit: The limit, bytes.
    """

    size: int
    limit: int

    def error(self) -> LimitExceeded:
        """The error to answer with."""
        return LimitExceeded(
            f"request message of {self.size} bytes is over the {self.limit}-byte limit"
        )


def encode_block_chunk(
    digest: str, offset: int, data: bytes | memoryview, block_size: int, last: bool
) -> bytes:
    """Serializes a ``BlockChunk`` by hand, with the data field last.

    The protobuf wire format (https://protobuf.dev/programming-guides/encoding/) lets
    fields appear in any order, so the fixed fields go first and the data is appended
    once: one copy of the bytes instead of building a message and serializing it.
    ``BlockChunk.FromString`` of the result equals the message with the same fields.

    Args:
        digest: The block's digest (32 characters).
        offset: Offset of ``data`` within the block, bytes.
        data: The chunk's bytes.
        block_size: The whole block's length, bytes.
        last: Whether this chunk ends the block.

    Returns:
        The serialized message.
    """
    head = bytearray(b"\x0a\x20")  # field 1 (digest), length-delimited, 32 bytes
    head += digest.encode("ascii")
    if offset:
        head += b"\x10" + encode_varint(offset)  # field 2 (offset), varint
    if block_size:
        head += b"\x20" + encode_varint(block_size)  # field 4 (block_size), varint
    if last:
        head += b"\x28\x01"  # field 5 (last), varint 1
    if not data:  # proto3 leaves default values out
        return bytes(head)
    head += b"\x1a" + encode_varint(len(data))  # field 3 (data), length-delimited
    return b"".join((head, data))


def pack_into_first(messages: Sequence[bytes], field: int) -> bytes:
    """One serialized message: the first of ``messages`` carrying the others as its
    repeated, length-delimited, self-typed field ``field`` (``BlockChunk.more``,
    ``ManifestEntry.more``).

    The protobuf wire format (https://protobuf.dev/programming-guides/encoding/) appends
    a repeated field's elements as tag, length and bytes, in any order with the other
    fields, so packing is concatenation: no message is decoded or re-encoded.

    Args:
        messages: Serialized messages of one type, in order (at least one); none may
            already use ``field``.
        field: The field number of the repeated self-typed field.
    """
    tag = encode_varint(field << 3 | 2)
    parts = [messages[0]]
    for message in messages[1:]:
        parts += (tag, encode_varint(len(message)), message)
    return b"".join(parts)


def pack_repeated(
    messages: Sequence[bytes], field: int, most: int, most_bytes: int = CHUNK_BYTES
) -> list[bytes]:
    """Packs serialized messages into groups, each one message (:func:`pack_into_first`).

    Args:
        messages: Serialized messages of one type, in order.
        field: The field number of the repeated self-typed field.
        most: Most messages per group (at least 1).
        most_bytes: A group is closed before it would exceed this many bytes (a single
            message larger than that is a group of its own).

    Returns:
        The packed messages, in order (one per group).
    """
    groups: list[list[bytes]] = []
    size = 0
    for message in messages:
        if not groups or len(groups[-1]) >= most or size + len(message) > most_bytes:
            groups.append([])
            size = 0
        groups[-1].append(message)
        size += len(message)
    return [pack_into_first(group, field) for group in groups]


def encode_varint(value: int) -> bytes:
    """Base-128 varint encoding of a non-negative integer (protobuf wire format)."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class HubWire(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Adapts the Hub methods' (de)serialization: request size limit, pre-encoded chunks.

    gRPC core refuses a message over its own receive limit before any Python code runs,
    so such a call could not be counted. The server therefore sets core's limit higher
    (a hard memory ceiling) and this interceptor enforces the configured limit while
    deserializing: an oversize request becomes an :class:`Oversize` marker, the handler
    answers ``RESOURCE_EXHAUSTED`` with a message, and the call is counted like any
    other. Responses may also be ``bytes`` already serialized (ReadBlocks' chunks by
    :func:`encode_block_chunk`, GetManifest's entries in worker threads); those pass
    through the serializer untouched.

    Args:
        limit: Largest request message accepted, bytes.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or not method.startswith(f"/{SERVICE_NAME}/"):
            return handler
        deserialize = handler.request_deserializer
        serialize = handler.response_serializer
        limit = self._limit

        def checked(raw: bytes) -> object:
            if len(raw) > limit:
                return Oversize(len(raw), limit)
            return deserialize(raw)

        def passthrough(message: object) -> bytes:
            if isinstance(message, bytes):
                return message
            serialized: bytes = serialize(message)
            return serialized

        return handler._replace(request_deserializer=checked, response_serializer=passthrough)


_ENTRY_TYPES = {
    EntryType.FILE: hub_pb2.ENTRY_TYPE_FILE,
    EntryType.DIRECTORY: hub_pb2.ENTRY_TYPE_DIRECTORY,
    EntryType.SYMLINK: hub_pb2.ENTRY_TYPE_SYMLINK,
}


_EVENT_KINDS = {
    EventKind.VERSION_PUBLISHED: hub_pb2.EVENT_KIND_VERSION_PUBLISHED,
    EventKind.TAG_MOVED: hub_pb2.EVENT_KIND_TAG_MOVED,
    EventKind.TAG_REMOVED: hub_pb2.EVENT_KIND_TAG_REMOVED,
    EventKind.VERSION_REVOKED: hub_pb2.EVENT_KIND_VERSION_REVOKED,
}


_PAGE_VERSION = struct.Struct(">I")


def snapshot_message(snapshot: Snapshot) -> hub_pb2.Snapshot:
    return hub_pb2.Snapshot(
        dataset=snapshot.dataset,
        version=snapshot.version,
        snapshot_id=snapshot.snapshot_id,
        created_ns=snapshot.created_ns,
        block_size=snapshot.block_size,
        file_count=snapshot.file_count,
        total_bytes=snapshot.total_bytes,
        entry_count=snapshot.entry_count,
        signature=snapshot.signature,
    )


def tag_message(tag: Tag) -> hub_pb2.Tag:
    return hub_pb2.Tag(name=tag.name, version=tag.version)


def entry_message(entry: ManifestEntry) -> hub_pb2.ManifestEntry:
    return hub_pb2.ManifestEntry(
        path=entry.path,
        type=_ENTRY_TYPES[entry.type],
        mode=entry.mode,
        size=entry.size,
        mtime_ns=entry.mtime_ns,
        symlink_target=entry.symlink_target,
        blocks=[hub_pb2.BlockRef(digest=block.digest, size=block.size) for block in entry.blocks],
    )


def event_message(event: Event) -> hub_pb2.CatalogEvent:
    return hub_pb2.CatalogEvent(
        sequence=event.sequence,
        kind=_EVENT_KINDS[event.kind],
        dataset=event.dataset,
        version=event.version_name,
        tag=event.tag,
        previous_version=event.previous_version_name,
        snapshot_id=event.snapshot_id,
        time_ns=event.time_ns,
    )


def encode_page_token(version: int, name: str) -> str:
    """A ``ListDirectory`` page token: the version being listed and the last name sent.

    The token pins the version (not the tag), so paging through a directory never mixes
    two versions while a tag moves.

    Args:
        version: The version number.
        name: The last child name returned.

    Returns:
        An opaque URL-safe string.
    """
    raw = _PAGE_VERSION.pack(version) + name.encode("utf-8")
    return base64.urlsafe_b64encode(raw).decode("ascii")


def decode_page_token(token: str) -> tuple[int, str]:
    """Parses :func:`encode_page_token`'s output.

    Returns:
        The version number and the last name returned.

    Raises:
        InvalidArgument: The token is malformed.
    """
    try:
        raw = base64.urlsafe_b64decode(token.encode("ascii"))
        (version,) = _PAGE_VERSION.unpack_from(raw)
        name = raw[_PAGE_VERSION.size :].decode("utf-8")
    except (binascii.Error, struct.error, UnicodeError, ValueError):
        raise InvalidArgument("malformed page token") from None
    if version == 0 or not name or "/" in name:
        raise InvalidArgument("malformed page token")
    return version, name


MANIFEST_PAGE_ENTRIES = 256
"""Manifest entries read per worker-thread call while streaming ``GetManifest``."""

MANIFEST_MESSAGE_BYTES = 96 * 1024
"""A ``GetManifest`` catalog page is cut once its entries pass this many serialized bytes,
so a stream holds at most about two such pages (the one being sent and the one read
ahead), whatever its entries' paths and block lists (issue 39's fifth probe)."""


async def manifest_messages(
    catalog: Catalog,
    snapshot_id: str,
    page_entries: int = 0,
    charge: Callable[[int], int] = lambda size: 0,
    release: Callable[[int], None] = lambda charged: None,
    turn: Callable[[], contextlib.AbstractAsyncContextManager[None]] | None = None,
) -> AsyncGenerator[bytes, None]:
    """A snapshot's manifest in path order as serialized ``ManifestEntry`` messages, one
    catalog page at a time.

    Each page (at most :data:`MANIFEST_PAGE_ENTRIES` entries, cut past
    :data:`MANIFEST_MESSAGE_BYTES`) is read, converted and serialized in a worker thread
    (the event loop only sends), while the next page is read ahead. With ``page_entries``
    the page goes as messages of that many entries (:func:`pack_repeated`, at most 1 MiB
    each).

    Each page is charged whole as soon as it is built, read-ahead included
    (``charge(serialized bytes)``, which returns what it charged or raises to refuse
    it), and given back (``release(charged)``) once its last message has left or the
    stream ends: a client that never takes the first message holds both pages charged
    (issue 39's seventh probe: a small first message, uncharged, kept 1.1 MB entries
    and the read-ahead page behind it uncounted). With ``turn``, each page is built
    holding one (the hub's :class:`~hub.limits.turns.FairTurns` of page builds).

    Raises:
        SnapshotNotFound: no live manifest is stored under ``snapshot_id``.
        Exception: what ``charge`` raises (the pages built are given back first).
    """

    def page_at(start: int) -> tuple[int, list[bytes], bool]:
        entries = catalog.manifest_page(
            snapshot_id, start, MANIFEST_PAGE_ENTRIES, MANIFEST_MESSAGE_BYTES
        )  # at least one; each entry decoded once (the probe's paging by bytes was quadratic)
        messages = [entry_message(entry).SerializeToString() for entry in entries]
        more = bool(entries)  # a page cut by bytes may end anywhere: the end is an empty page
        if page_entries > 0:
            field = hub_pb2.ManifestEntry.MORE_FIELD_NUMBER
            return len(messages), pack_repeated(messages, field, page_entries), more
        return len(messages), messages, more

    async def built(start: int) -> tuple[int, list[bytes], bool, int]:
        async with turn() if turn is not None else contextlib.nullcontext():
            count, page, more = await asyncio.to_thread(page_at, start)
        return count, page, more, charge(sum(map(len, page)))  # on the loop, as it arrives

    start, charged = 0, 0
    pending: asyncio.Future[tuple[int, list[bytes], bool, int]] | None
    pending = asyncio.ensure_future(built(start))
    try:
        while pending is not None:
            count, page, more, charged = await pending
            start, pending = start + count, None
            if more:
                pending = asyncio.ensure_future(built(start))
            for message in page:
                yield message
            del page
            release(charged)
            charged = 0
    finally:
        release(charged)
        if pending is not None and not pending.done():
            pending.cancel()
        elif pending is not None and not pending.cancelled() and pending.exception() is None:
            release(pending.result()[3])  # read ahead, charged, never sent
