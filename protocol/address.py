"""``HOST:PORT``: how every Strata endpoint is named on a command line or in a setting.

The hub's ``--listen``, the spoke's ``--hub`` and ``--admin-listen``, and the benchmark
tools all take this one syntax, so it is parsed in one place, next to the wire contract
that hub and spoke share (both may import :mod:`protocol`; neither may import the other).
IPv6 hosts are written in brackets (``[::1]:50051``, RFC 3986 section 3.2.2).
"""

from __future__ import annotations

import ipaddress


def split_hostport(text: str) -> tuple[str, str]:
    """``(host, port)`` of ``HOST:PORT``, both as written, the host without brackets.

    Splits at the last colon, so a bracketed IPv6 host keeps its own colons. Nothing is
    validated: ``("", "")`` comes back for text without a colon, and an empty host for
    ``":9000"``. Callers that need a valid address use :func:`parse_hostport`.
    """
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return (host, port) if sep else ("", "")


def parse_hostport(text: str, default_host: str | None = None) -> tuple[str, int]:
    """``("127.0.0.1", 9000)`` from ``"127.0.0.1:9000"``.

    Args:
        text: ``HOST:PORT``; the port is 0 to 65535 (0 asks the kernel for a free one).
        default_host: Host to use when ``text`` has none (``":9000"``); ``None`` makes a
            missing host an error.

    Returns:
        The host (without brackets) and the port.

    Raises:
        ValueError: ``text`` is not ``HOST:PORT`` with a port from 0 to 65535 (the message
            names ``text``).
    """
    host, port = split_hostport(text)
    if not host and default_host is not None and text.rpartition(":")[1]:
        host = default_host
    if not host or not port.isascii() or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"expected HOST:PORT with a port from 0 to 65535, not {text!r}")
    return host, int(port)


def parse_option_hostport(value: str, option: str) -> tuple[str, int]:
    """:func:`parse_hostport` of a command-line option's value, the error naming the option
    (``--hub must be HOST:PORT, got 'x'``), for settings validators.

    Raises:
        ValueError: ``value`` is not ``HOST:PORT`` with a port from 0 to 65535.
    """
    try:
        return parse_hostport(value)
    except ValueError:
        raise ValueError(f"{option} must be HOST:PORT, got {value!r}") from None


def grpc_target(text: str, option: str = "--hub") -> str:
    """The gRPC target for one or several ``HOST:PORT`` (comma-separated) of one service.

    One address: a DNS name becomes ``dns:///NAME:PORT`` (gRPC's resolver, which returns
    every A/AAAA record, so a round-robin channel spreads over all of them); an IP address
    stays as written. Several addresses must be IP addresses, all of one family, and become
    ``ipv4:A:P,B:P`` or ``ipv6:[A]:P,[B]:P`` (gRPC's static resolvers; gRPC's naming
    document, https://github.com/grpc/grpc/blob/master/doc/naming.md). Several DNS names
    have no one gRPC target: give one name with several records instead.

    Raises:
        ValueError: An address is malformed or given twice, or several are given and one
            is a name, or the families are mixed (the message names ``option``).
    """
    parts = [part.strip() for part in text.split(",")]
    hosts = []
    for part in parts:
        try:
            host, port = parse_hostport(part)
        except ValueError:
            raise ValueError(f"{option} must be HOST:PORT[,HOST:PORT…], got {text!r}") from None
        hosts.append((host, port))
    if len(set(hosts)) != len(hosts):
        raise ValueError(f"{option} names an address twice: {text!r}")
    families = {_family(host) for host, _ in hosts}
    if len(hosts) == 1:
        host, port = hosts[0]
        return f"dns:///{host}:{port}" if families == {None} else parts[0]
    if None in families or len(families) > 1:
        raise ValueError(
            f"{option} with several addresses takes IP addresses of one family, got {text!r}; "
            "for names, give one DNS name whose records list every replica"
        )
    if families == {4}:
        return "ipv4:" + ",".join(f"{host}:{port}" for host, port in hosts)
    return "ipv6:" + ",".join(f"[{host}]:{port}" for host, port in hosts)


def _family(host: str) -> int | None:
    """4 or 6 for an IP address literal, None for a name."""
    try:
        return ipaddress.ip_address(host).version
    except ValueError:
        return None
