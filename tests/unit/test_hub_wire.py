"""Hand-serialized BlockChunk messages parse exactly like protobuf's own."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hub.blocks import block_digest
from hub.errors import InvalidArgument
from hub.wire import decode_page_token, encode_block_chunk, encode_page_token
from protocol.hub.v1 import hub_pb2


@given(
    data=st.binary(max_size=3000),
    offset=st.integers(min_value=0, max_value=2**40),
    extra=st.integers(min_value=0, max_value=2**40),
    last=st.booleans(),
)
def test_encode_block_chunk_matches_protobuf(
    data: bytes, offset: int, extra: int, last: bool
) -> None:
    digest = block_digest(data)
    size = offset + len(data) + extra
    wire = encode_block_chunk(digest, offset, data, size, last)
    expected = hub_pb2.BlockChunk(
        digest=digest, offset=offset, data=data, block_size=size, last=last
    )
    assert hub_pb2.BlockChunk.FromString(wire) == expected
    assert len(wire) == expected.ByteSize()


def test_page_tokens_round_trip_and_reject_garbage() -> None:
    assert decode_page_token(encode_page_token(7, "sample-00042.npy")) == (7, "sample-00042.npy")
    for token in ("%%%", "AAAA", encode_page_token(1, "a")[:-2] + "!!", "AAAAAWEvYg=="):
        with pytest.raises(InvalidArgument, match="malformed page token"):
            decode_page_token(token)
