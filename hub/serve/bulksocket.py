"""The bulk channel's sockets (:mod:`hub.serve.bulk`): the port's TLS context, a peer's
name as gRPC writes it, how many of a connection's bytes the client has taken
(``TCP_INFO``), and readahead of the blob file sent next.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import struct
from pathlib import Path

from hub.errors import ConfigError
from protocol import bulk


def tls_context(
    cert: Path | None, key: Path | None, client_ca: Path | None
) -> ssl.SSLContext | None:
    """The bulk port's TLS context from the gRPC port's files: its certificate and key,
    TLS 1.2 or later, client certificates required when ``client_ca`` is set (mutual
    TLS), ALPN :data:`protocol.bulk.ALPN`; None without a certificate (plaintext).

    Raises:
        ConfigError: a file is unreadable or not a matching certificate and key.
    """
    if cert is None or key is None:
        return None
    try:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(str(cert), str(key))
        if client_ca is not None:
            context.load_verify_locations(str(client_ca))
            context.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"unusable TLS certificate or key for --bulk-port: {exc}") from exc
    context.set_alpn_protocols([bulk.ALPN])
    return context


_TCP_INFO = struct.Struct("120xQ")
"""``struct tcp_info`` up to ``tcpi_bytes_acked`` (Linux 4.1, ``linux/tcp.h``): the bytes
of the connection the peer's kernel has acknowledged."""


def acked_bytes(transport: asyncio.WriteTransport) -> int | None:
    """Bytes of the connection the client has taken so far (``tcpi_bytes_acked``, tcp(7)
    ``TCP_INFO``): its kernel acknowledges them only while its receive buffer has room,
    that is while the client reads. None where the kernel does not say."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO.size)
    except (OSError, AttributeError):
        return None
    if len(info) < _TCP_INFO.size:
        return None
    acked: int = _TCP_INFO.unpack(info)[0]
    return acked


def will_need(path: os.PathLike[str]) -> None:
    """Asks the kernel to read a blob file ahead (``POSIX_FADV_WILLNEED``); errors ignored."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        finally:
            os.close(fd)
