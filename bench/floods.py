"""Connection floods the door benches share: many loopback addresses, a rate, and what each
connection sends first (nothing, a whole TLS ClientHello, or all but its last byte)."""

from __future__ import annotations

import collections
import contextlib
import socket
import ssl
import time
from pathlib import Path


def client_hello(ca_cert: Path) -> bytes:
    """A real TLS ClientHello's record, as a client trusting ``ca_cert`` first sends it."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(str(ca_cert))
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = context.wrap_bio(incoming, outgoing, server_hostname="localhost")
    with contextlib.suppress(ssl.SSLWantReadError):
        client.do_handshake()
    return outgoing.read()


def flood_address(n: int, addresses: int, networks: int = 0) -> str:
    """The ``n``-th flood connection's loopback source address, of ``addresses`` in all.

    Args:
        n: The connection's number (0 on).
        addresses: How many addresses the flood uses (at most 25,000).
        networks: Over how many /16s (``127.100.0.0/16`` on, at most 150) they are spread,
            round robin; 0 keeps 250 addresses a /16, each in its own /24
            (``127.100.0.7`` to ``127.100.249.7``, then ``127.101.0.7``).
    """
    n %= addresses
    if networks <= 0:
        return f"127.{100 + n // 250}.{n % 250}.7"
    within = n // networks
    return f"127.{100 + n % networks}.{within % 250}.{7 + within // 250}"


def flood(
    node: str, rate: float, addresses: int, seconds: float, said: bytes, networks: int = 0
) -> None:
    """Opens non-blocking connections to ``node`` (``HOST:PORT``) at ``rate`` a second for
    ``seconds``, from ``addresses`` loopback addresses (:func:`flood_address`, over
    ``networks`` /16s), each sending ``said`` (nothing when empty) 50 ms after it began and
    then nothing, the newest 6,000 kept open; prints the achieved rate."""
    host, port = node.rsplit(":", 1)
    start, opened = time.monotonic(), 0
    connecting: collections.deque[tuple[socket.socket, float]] = collections.deque()
    held: collections.deque[socket.socket] = collections.deque()
    while time.monotonic() - start < seconds:
        sock = socket.socket()
        sock.setblocking(False)
        sock.bind((flood_address(opened, addresses, networks), 0))
        with contextlib.suppress(BlockingIOError):
            sock.connect((host, int(port)))
        connecting.append((sock, time.monotonic()))
        opened += 1
        while connecting and connecting[0][1] < time.monotonic() - 0.05:
            ready, _ = connecting.popleft()
            if said:
                with contextlib.suppress(OSError):
                    ready.send(said)
            held.append(ready)
        while len(held) > 6000:
            held.popleft().close()
        time.sleep(max(0.0, start + opened / rate - time.monotonic()))
    print(f"{opened / (time.monotonic() - start):.0f}", flush=True)
