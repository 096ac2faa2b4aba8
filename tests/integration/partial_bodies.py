"""A gRPC caller that never finishes its request: raw HTTP/2 (the ``h2`` library) on one
connection, each stream declaring a large gRPC message and sending all of it that the
server's flow-control windows allow, short of its last bytes, then stalling.

gRPC's own clients always send whole messages, so they cannot show what a server holds
for a request still arriving; this is what an attacker with a valid token would send.
gRPC over HTTP/2 (https://github.com/grpc/grpc/blob/master/doc/PROTOCOL-HTTP2.md): a
POST with ``content-type: application/grpc`` and ``te: trailers``, then DATA whose
message is one byte of compression flag, four of big-endian length and the bytes.
"""

from __future__ import annotations

import select
import socket
import ssl
import struct
import time
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h2.exceptions


@dataclass
class StreamState:
    """One stalled stream: what was sent, and how the server ended it (if it did).

    Attributes:
        declared: The message length announced, bytes.
        short: Bytes of it never sent.
        opened: When the stream was opened (``time.monotonic()``).
        sent: Message bytes sent so far (the 5-byte prefix not counted).
        prefixed: Whether the prefix has been sent.
        ended_s: Seconds from the stream's opening until the server ended it; None while open.
        status: ``grpc-status`` of the trailers, or ``"RST <code>"`` for a reset.
        message: ``grpc-message`` of the trailers, if any.
        headers: The response's headers and trailers.
    """

    declared: int
    short: int
    opened: float
    sent: int = 0
    prefixed: bool = False
    ended_s: float | None = None
    status: str | None = None
    message: str = ""
    headers: dict[str, str] = field(default_factory=dict)


class PartialRequests:
    """One HTTP/2 connection whose gRPC streams stall inside their request message.

    Args:
        host: The server's address (loopback only, in tests).
        port: Its port.
        tls: A client TLS context (ALPN ``h2`` is set here); None for plaintext.
        server_name: The name the server's certificate is checked against.
    """

    def __init__(
        self,
        host: str,
        port: int,
        tls: ssl.SSLContext | None = None,
        server_name: str | None = None,
    ) -> None:
        sock = socket.create_connection((host, port), timeout=10)
        if tls is not None:
            tls.set_alpn_protocols(["h2"])
            sock = tls.wrap_socket(sock, server_hostname=server_name or host)
        sock.setblocking(False)
        self._sock = sock
        self._authority = f"{host}:{port}"
        self._h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        self._h2.initiate_connection()
        self.streams: dict[int, StreamState] = {}
        self.closed = False
        self._flush()

    def open(
        self,
        path: str,
        declared: int,
        metadata: tuple[tuple[str, str], ...] = (),
        count: int = 1,
        short: int = 1,
    ) -> list[int]:
        """Opens ``count`` streams calling ``path`` (``/package.Service/Method``), each
        announcing a message of ``declared`` bytes of which at most ``declared - short``
        will be sent.

        Returns:
            The new streams' ids.
        """
        ids = []
        for _ in range(count):
            stream_id = self._h2.get_next_available_stream_id()
            headers = [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", path),
                (":authority", self._authority),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                *metadata,
            ]
            self._h2.send_headers(stream_id, headers)
            state = StreamState(declared, short, time.monotonic())
            self.streams[stream_id] = state
            ids.append(stream_id)
        self._send_more()
        self._flush()
        return ids

    def pump(self, seconds: float) -> None:
        """Reads the server and sends what its windows allow for ``seconds``."""
        deadline = time.monotonic() + seconds
        while not self.closed:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            readable, _, _ = select.select([self._sock], [], [], min(left, 0.05))
            if readable:
                self._receive()
            self._send_more()
            self._flush()

    def open_streams(self) -> int:
        """Streams the server has not ended."""
        return sum(1 for s in self.streams.values() if s.ended_s is None)

    def bytes_sent(self) -> int:
        """Message bytes sent on every stream."""
        return sum(s.sent for s in self.streams.values())

    def close(self) -> None:
        """Closes the connection (without a GOAWAY: as a vanished client would)."""
        self.closed = True
        self._sock.close()

    def _receive(self) -> None:
        try:
            data = self._sock.recv(1 << 20)
        except (BlockingIOError, ssl.SSLWantReadError):
            return
        except OSError:
            self.closed = True
            return
        if not data:
            self.closed = True
            return
        for event in self._h2.receive_data(data):
            self._on(event)

    def _on(self, event: h2.events.Event) -> None:
        now = time.monotonic()
        stream = self.streams.get(getattr(event, "stream_id", 0) or 0)
        if isinstance(event, h2.events.ConnectionTerminated):
            self.closed = True
            for state in self.streams.values():
                if state.ended_s is None:
                    state.ended_s, state.status = now - state.opened, "GOAWAY"
        elif stream is None:
            return
        elif isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
            headers = dict(event.headers)
            stream.headers.update(headers)
            if "grpc-status" in headers and stream.ended_s is None:
                stream.ended_s = now - stream.opened
                stream.status = headers["grpc-status"]
                stream.message = headers.get("grpc-message", "")
        elif isinstance(event, h2.events.StreamReset):
            if stream.ended_s is None:
                stream.ended_s, stream.status = now - stream.opened, f"RST {event.error_code}"
        elif isinstance(event, h2.events.DataReceived):
            self._h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)

    def _send_more(self) -> None:
        """Sends each open stream's message (its 5-byte prefix first) as far as the
        connection's and the stream's windows allow."""
        for stream_id, state in self.streams.items():
            while state.ended_s is None:
                prefix = b"" if state.prefixed else struct.pack(">BI", 0, state.declared)
                want = len(prefix) + state.declared - state.short - state.sent
                try:
                    window = self._h2.local_flow_control_window(stream_id)
                except h2.exceptions.StreamClosedError:
                    break
                size = min(want, window, self._h2.max_outbound_frame_size)
                if size <= len(prefix):  # the prefix goes whole, or not yet
                    break
                try:
                    self._h2.send_data(stream_id, prefix + bytes(size - len(prefix)))
                except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
                    break
                state.prefixed = True
                state.sent += size - len(prefix)

    def _flush(self) -> None:
        data = self._h2.data_to_send()
        while data and not self.closed:
            try:
                sent = self._sock.send(data)
            except (BlockingIOError, ssl.SSLWantWriteError):
                select.select([], [self._sock], [], 1.0)
                continue
            except OSError:
                self.closed = True
                return
            data = data[sent:]
