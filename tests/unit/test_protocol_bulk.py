"""The bulk channel's frames (protocol/bulk.py): what is sent is what is parsed, and
what is not the protocol is refused with a message."""

from __future__ import annotations

import pytest

from protocol import bulk

DIGEST = "0123456789abcdef0123456789abcdef"


def test_a_request_round_trips() -> None:
    raw = bulk.encode_request("tok", [DIGEST, "f" * 32])
    head = raw[: bulk.REQUEST_HEAD.size]
    token_len = bulk.parse_request_head(head)
    rest = raw[bulk.REQUEST_HEAD.size :]
    assert rest[:token_len] == b"tok"
    count = bulk.parse_count(rest[token_len : token_len + 2])
    assert bulk.split_digests(rest[token_len + 2 :]) == (DIGEST, "f" * 32)
    assert count == 2
    assert len(raw) == 4 + 2 + 3 + 2 + 32


def test_reply_heads_round_trip() -> None:
    assert bulk.parse_block_head(bulk.encode_block_head(DIGEST, 4 << 20)) == (0, DIGEST, 4 << 20)
    frame = bulk.encode_error(16, "unknown bearer token")
    assert len(frame) == bulk.BLOCK_HEAD.size + len("unknown bearer token")
    code, digest, length = bulk.parse_block_head(frame[: bulk.BLOCK_HEAD.size])
    assert (code, digest, length) == (16, "", 20)
    assert frame[bulk.BLOCK_HEAD.size :] == b"unknown bearer token"
    assert len(bulk.encode_error(5, "x" * 10_000)) == bulk.BLOCK_HEAD.size + bulk.MAX_MESSAGE_BYTES


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: bulk.encode_request("t" * 4097, [DIGEST]), "at most 4096"),
        (lambda: bulk.encode_request("", [DIGEST] * 513), "at most 512"),
        (lambda: bulk.encode_request("", ["xyz"]), "not a block digest"),
        (lambda: bulk.encode_request("", ["g" * 32]), "not a block digest"),
        (lambda: bulk.parse_request_head(b"GET / "), "not a bulk request"),
        (lambda: bulk.parse_request_head(bulk.REQUEST_HEAD.pack(bulk.MAGIC, 5000)), "at most"),
        (lambda: bulk.parse_count(bulk.COUNT.pack(0)), "1 to 512"),
        (lambda: bulk.parse_count(bulk.COUNT.pack(513)), "1 to 512"),
        (lambda: bulk.parse_block_head(bytes([99]) + bytes(20)), "unknown reply code"),
        (
            lambda: bulk.parse_block_head(bulk.BLOCK_HEAD.pack(0, bytes(16), (1 << 30) + 1)),
            "a block of",
        ),
    ],
)
def test_what_is_not_the_protocol_is_refused(make: object, message: str) -> None:
    with pytest.raises(bulk.BulkProtocolError, match=message):
        make()  # type: ignore[operator]


def test_error_frames_carry_only_known_codes() -> None:
    with pytest.raises(ValueError, match="not an error code"):
        bulk.encode_error(0, "ok is not an error")
