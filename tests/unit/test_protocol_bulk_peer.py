"""The bulk channel's peer variant (protocol/bulk.py): a peer request carries what the
gRPC peer call carries and parses back the same; the declined frame round-trips; what is
not the protocol is refused with a message; hub-bulk frames are not peer requests."""

from __future__ import annotations

import pytest

from protocol import bulk

DIGEST = "0123456789abcdef0123456789abcdef"
OTHER = "f" * 32


def _request(**changes: object) -> bulk.PeerRequest:
    fields: dict[str, object] = {
        "token": "region-token",
        "grant": b"\x0a\x03grant",
        "proof": b"\x12\x05proof",
        "request_class": "prefetch",
        "blocks": ((DIGEST, 4 << 20), (OTHER, 17)),
        "snapshots": (("ds", "v1", DIGEST), ("näme", "v2", OTHER)),
    }
    fields.update(changes)
    return bulk.PeerRequest(**fields)  # type: ignore[arg-type]


def _parse(raw: bytes) -> bulk.PeerRequest:
    length = bulk.parse_peer_head(raw[: bulk.PEER_HEAD.size])
    assert length == len(raw) - bulk.PEER_HEAD.size
    return bulk.parse_peer_request(raw[bulk.PEER_HEAD.size :])


@pytest.mark.parametrize(
    "request_",
    [
        _request(),
        _request(token="", grant=b"", proof=b"", request_class="", snapshots=()),
        _request(blocks=tuple((f"{i:032x}", i) for i in range(bulk.MAX_DIGESTS))),
    ],
    ids=["everything", "nothing-but-blocks", "most-blocks"],
)
def test_a_peer_request_round_trips(request_: bulk.PeerRequest) -> None:
    assert _parse(bulk.encode_peer_request(request_)) == request_


def test_snapshots_past_the_most_are_left_out() -> None:
    many = tuple(("ds", f"v{i}", DIGEST) for i in range(bulk.MAX_SNAPSHOTS + 5))
    parsed = _parse(bulk.encode_peer_request(_request(snapshots=many)))
    assert parsed.snapshots == many[: bulk.MAX_SNAPSHOTS]


def test_the_declined_frame_round_trips_and_is_not_a_hub_frame() -> None:
    frame = bulk.encode_declined([DIGEST, OTHER])
    head = frame[: bulk.BLOCK_HEAD.size]
    assert bulk.parse_peer_reply_head(head) == (bulk.DECLINED, "", 2)
    assert bulk.split_digests(frame[bulk.BLOCK_HEAD.size :]) == (DIGEST, OTHER)
    assert bulk.parse_peer_reply_head(bulk.encode_block_head(DIGEST, 5)) == (bulk.OK, DIGEST, 5)
    error = bulk.encode_error(16, "missing or wrong peer token")
    assert bulk.parse_peer_reply_head(error[: bulk.BLOCK_HEAD.size]) == (16, "", 27)
    with pytest.raises(bulk.BulkProtocolError, match="unknown reply code"):
        bulk.parse_block_head(head)  # a hub never sends it


def _body(raw: bytes) -> bytes:
    return raw[bulk.PEER_HEAD.size :]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: bulk.encode_peer_request(_request(token="t" * 4097)), "at most 4096"),
        (lambda: bulk.encode_peer_request(_request(grant=b"g" * 4097)), "grant of 4097"),
        (lambda: bulk.encode_peer_request(_request(blocks=((DIGEST, 1),) * 513)), "at most 512"),
        (lambda: bulk.encode_peer_request(_request(blocks=(("xyz", 1),))), "not a block digest"),
        (lambda: bulk.encode_peer_request(_request(blocks=((DIGEST, 1 << 31),))), "a block of"),
        (lambda: bulk.parse_peer_head(bulk.encode_request("t", [DIGEST])[:8]), "not a peer bulk"),
        (lambda: bulk.parse_peer_head(bulk.PEER_HEAD.pack(bulk.PEER_MAGIC, 1 << 20)), "at most"),
        (lambda: bulk.parse_peer_request(_body(bulk.encode_peer_request(_request()))[:-1]), "cut"),
        (
            lambda: bulk.parse_peer_request(_body(bulk.encode_peer_request(_request())) + b"x"),
            "after",
        ),
        (lambda: bulk.parse_peer_reply_head(bulk.BLOCK_HEAD.pack(255, bytes(16), 600)), "declined"),
    ],
)
def test_what_is_not_the_peer_protocol_is_refused(make: object, message: str) -> None:
    with pytest.raises(bulk.BulkProtocolError, match=message):
        make()  # type: ignore[operator]


def test_the_hub_server_refuses_a_peer_request() -> None:
    raw = bulk.encode_peer_request(_request())
    with pytest.raises(bulk.BulkProtocolError, match="not a bulk request"):
        bulk.parse_request_head(raw[: bulk.REQUEST_HEAD.size])
