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


def flood(node: str, rate: float, addresses: int, seconds: float, said: bytes) -> None:
    """Opens non-blocking connections to ``node`` (``HOST:PORT``) at ``rate`` a second for
    ``seconds``, from ``addresses`` loopback addresses (``127.100.0.7`` on), each sending
    ``said`` (nothing when empty) 50 ms after it began and then nothing, the newest 6,000
    kept open; prints the achieved rate."""
    host, port = node.rsplit(":", 1)
    start, opened = time.monotonic(), 0
    connecting: collections.deque[tuple[socket.socket, float]] = collections.deque()
    held: collections.deque[socket.socket] = collections.deque()
    while time.monotonic() - start < seconds:
        sock = socket.socket()
        sock.setblocking(False)
        n = opened % addresses
        sock.bind((f"127.{100 + n // 250}.{n % 250}.7", 0))
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
