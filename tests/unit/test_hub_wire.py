"""Hand-serialized BlockChunk messages parse exactly like protobuf's own."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hub.errors import InvalidArgument
from hub.serve.wire import decode_page_token, encode_block_chunk, encode_page_token, pack_repeated
from hub.snapshot.blocks import block_digest
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


@given(
    sizes=st.lists(st.integers(min_value=0, max_value=300), max_size=40),
    most=st.integers(min_value=1, max_value=8),
    most_bytes=st.integers(min_value=1, max_value=1000),
)
def test_pack_repeated_round_trips_within_its_limits(
    sizes: list[int], most: int, most_bytes: int
) -> None:
    entries = [
        hub_pb2.ManifestEntry(path=f"p{i}", size=size, symlink_target="x" * size)
        for i, size in enumerate(sizes)
    ]
    serialized = [entry.SerializeToString() for entry in entries]
    packed = pack_repeated(serialized, hub_pb2.ManifestEntry.MORE_FIELD_NUMBER, most, most_bytes)
    messages = [hub_pb2.ManifestEntry.FromString(raw) for raw in packed]
    flat = [e for m in messages for e in (m, *m.more)]
    assert [e.path for e in flat] == [e.path for e in entries]
    assert [e.symlink_target for e in flat] == [e.symlink_target for e in entries]
    start = 0
    for message in messages:
        count = 1 + len(message.more)
        group = serialized[start : start + count]
        assert count <= most
        assert count == 1 or sum(map(len, group)) <= most_bytes
        if start + count < len(serialized):  # closed because the next would not fit
            assert (
                count == most or sum(map(len, group)) + len(serialized[start + count]) > most_bytes
            )
        start += count
