"""What a door waits for before it relays a connection (strata_local/door.py): a whole TLS
handshake record or HTTP/2's preface, nothing else."""

from __future__ import annotations

import pytest

from strata_local.door import FIRST_MESSAGE_MOST, PREFACE, _first_message


@pytest.mark.parametrize(
    ("said", "need"),
    [
        (b"\x16", 5),  # a record's type: its head next
        (b"\x16\x03\x01", 5),
        (b"\x16\x03\x01\x02\x00", 5 + 512),  # a head declaring 512 bytes
        (b"\x16\x03\x01\x02\x00" + bytes(512), 5 + 512),  # whole
        (b"P", len(PREFACE)),
        (PREFACE[:10], len(PREFACE)),
        (PREFACE, len(PREFACE)),
    ],
)
def test_a_first_message_is_waited_for_whole(said: bytes, need: int) -> None:
    assert _first_message(said) == need


@pytest.mark.parametrize(
    "said",
    [
        b"",  # closed
        b"GET / HTTP/1.1\r\n",
        b"\x17\x03\x03\x00\x10",  # application data first
        b"PRX",
        b"\x16\x03\x01\xff\xff",  # a record longer than TLS allows
    ],
)
def test_anything_else_is_refused(said: bytes) -> None:
    assert _first_message(said) is None
    assert FIRST_MESSAGE_MOST < 0xFFFF + 5
