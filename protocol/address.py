"""``HOST:PORT``: how every Strata endpoint is named on a command line or in a setting.

The hub's ``--listen``, the spoke's ``--hub`` and ``--admin-listen``, and the benchmark
tools all take this one syntax, so it is parsed in one place, next to the wire contract
that hub and spoke share (both may import :mod:`protocol`; neither may import the other).
IPv6 hosts are written in brackets (``[::1]:50051``, RFC 3986 section 3.2.2).
"""

from __future__ import annotations


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
