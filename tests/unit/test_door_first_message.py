"""What a door waits for before it relays a connection (strata_local/doorway.py): a whole TLS
handshake record or HTTP/2's preface, nothing else."""

from __future__ import annotations

import pytest

from strata_local.doorway import FIRST_MESSAGE_MOST, PREFACE, grpc_first, tls_hello


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
    assert grpc_first(said) == need


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
    assert grpc_first(said) is None
    assert FIRST_MESSAGE_MOST < 0xFFFF + 5


def test_a_tls_port_waits_for_the_client_hello_alone() -> None:
    """A bulk port under TLS (strata_local/streamdoor.py): a ClientHello's record, and not
    HTTP/2's preface."""
    assert tls_hello(b"\x16\x03\x01\x02\x00") == 5 + 512
    assert tls_hello(b"\x16") == 5
    assert tls_hello(PREFACE) is None
    assert tls_hello(b"SBK1") is None
    assert tls_hello(b"") is None
