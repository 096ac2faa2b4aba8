"""HOST:PORT, parsed in one place for the hub, the spoke and the benchmarks."""

from __future__ import annotations

import pytest

from hub.errors import InvalidArgument
from hub.serve.address import Address
from protocol.address import grpc_target, parse_hostport, parse_option_hostport, split_hostport
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


@pytest.mark.parametrize(
    ("text", "target"),
    [
        ("hub.example:50051", "dns:///hub.example:50051"),
        ("10.0.0.1:50051", "10.0.0.1:50051"),
        ("10.0.0.1:50051, 10.0.0.2:50051", "ipv4:10.0.0.1:50051,10.0.0.2:50051"),
        ("[::1]:1,[::2]:2", "ipv6:[::1]:1,[::2]:2"),
    ],
)
def test_grpc_target_of_one_or_several_replicas(text: str, target: str) -> None:
    assert grpc_target(text) == target


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("a.example:1,b.example:2", "IP addresses of one family"),
        ("10.0.0.1:1,[::1]:1", "IP addresses of one family"),
        ("10.0.0.1:1,10.0.0.1:1", "names an address twice"),
        ("10.0.0.1:1,", "HOST:PORT"),
        ("10.0.0.1", "HOST:PORT"),
    ],
)
def test_grpc_target_refuses_what_grpc_could_not_balance(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        grpc_target(text, "--hub")
