"""HOST:PORT, parsed in one place for the hub, the spoke and the benchmarks."""

from __future__ import annotations

import pytest

from hub.address import Address
from hub.errors import InvalidArgument
from protocol.address import parse_hostport, parse_option_hostport, split_hostport
from spoke.serve.adminserver import bind


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:50051", ("127.0.0.1", 50051)),
        ("localhost:0", ("localhost", 0)),
        ("[::1]:9000", ("::1", 9000)),
        ("host:65535", ("host", 65535)),
    ],
)
def test_valid_addresses(text: str, expected: tuple[str, int]) -> None:
    assert parse_hostport(text) == expected
    assert parse_option_hostport(text, "--hub") == expected
    assert (Address.parse(text).host, Address.parse(text).port) == expected


@pytest.mark.parametrize("text", ["", "localhost", ":9000", "h:", "h:65536", "h:-1", "h:1a", "h:٣"])
def test_invalid_addresses_name_the_text(text: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_hostport(text)
    with pytest.raises(ValueError, match=r"--hub must be HOST:PORT"):
        parse_option_hostport(text, "--hub")
    with pytest.raises(InvalidArgument, match="invalid address"):
        Address.parse(text)


def test_a_default_host_fills_only_an_empty_one() -> None:
    assert parse_hostport(":9000", default_host="127.0.0.1") == ("127.0.0.1", 9000)
    assert parse_hostport("h:9000", default_host="127.0.0.1") == ("h", 9000)
    with pytest.raises(ValueError):
        parse_hostport("9000", default_host="127.0.0.1")
    assert split_hostport("[::1]:0") == ("::1", "0") and split_hostport("x") == ("", "")


def test_the_admin_api_binds_the_parsed_address() -> None:
    sock = bind(":0")
    try:
        host, port = sock.getsockname()[:2]
        assert host == "127.0.0.1" and port > 0
    finally:
        sock.close()
    with pytest.raises(ValueError, match="admin address must be HOST:PORT"):
        bind("127.0.0.1:99999")
