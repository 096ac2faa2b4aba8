"""The WAN emulator (bench/wan.py): delay, rate cap, jitter, cut and restore, counters.

The emulator is checked against its own settings on loopback: round trips and throughput
through it must be within 10 % of what it was set to (a delay: 10 % or 5 ms, the
thread wake-up slack). Each check measures about a second of traffic, so the whole file
runs in a few seconds.
"""

from __future__ import annotations

import hashlib
import math
import os
import socket
import statistics
import threading
import time
from collections.abc import Iterator

import pytest

from bench.wan import LinkSpec, WanProxy, format_rate, parse_hostport, parse_rate

# the emulator is checked against wall-clock delays and rates: run alone (make pytest)
pytestmark = pytest.mark.timing


class _Server:
    """A threaded TCP server on 127.0.0.1: ``echo`` sends back what it gets, ``source``
    sends ``nbytes`` of a fixed pattern then closes, ``sink`` counts what arrives."""

    def __init__(self, mode: str, nbytes: int = 0) -> None:
        self.mode = mode
        self.nbytes = nbytes
        self.received = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = self.sock.getsockname()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            try:
                if self.mode == "echo":
                    while data := conn.recv(65536):
                        conn.sendall(data)
                elif self.mode == "source":
                    block = bytes(range(256)) * 4096  # 1 MiB
                    left = self.nbytes
                    while left > 0:
                        conn.sendall(block[: min(left, len(block))])
                        left -= len(block)
                else:
                    while data := conn.recv(65536):
                        self.received += len(data)
            except OSError:
                pass

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def echo() -> Iterator[_Server]:
    server = _Server("echo")
    yield server
    server.close()


# A delay is honoured by a thread waking at its deadline; on a shared 2-core machine the
# wake-up can come a few milliseconds late. The floor stays exact; the ceiling allows this.
WAKE_SLACK_S = 0.005


def _connect(proxy: WanProxy) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _ping(sock: socket.socket, payload: bytes = b"p") -> float:
    started = time.perf_counter()
    sock.sendall(payload)
    got = b""
    while len(got) < len(payload):
        chunk = sock.recv(65536)
        assert chunk, "connection closed during a ping"
        got += chunk
    assert got == payload
    return time.perf_counter() - started


def _closed(sock: socket.socket, send: bytes = b"") -> bool:
    """Whether the proxy closed or reset the connection (within 5 s)."""
    sock.settimeout(5)
    try:
        if send:
            sock.sendall(send)
        return sock.recv(10) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


def _round_trips(proxy: WanProxy, count: int) -> list[float]:
    with _connect(proxy) as sock:
        _ping(sock)  # the first one also pays the emulated TCP handshake
        return [_ping(sock) for _ in range(count)]


@pytest.mark.parametrize("rtt_ms", [20, 50])
def test_round_trip_time_matches_the_setting(echo: _Server, rtt_ms: int) -> None:
    with WanProxy(echo.address, LinkSpec(rtt_s=rtt_ms / 1000, rate_bps=math.inf)) as proxy:
        rtts = _round_trips(proxy, 9)
    assert min(rtts) >= rtt_ms / 1000 * 0.99  # the delay is a floor ...
    assert statistics.median(rtts) == pytest.approx(rtt_ms / 1000, rel=0.10, abs=WAKE_SLACK_S)


def test_a_new_connection_pays_one_extra_round_trip(echo: _Server) -> None:
    spec = LinkSpec(rtt_s=0.04, rate_bps=math.inf)
    with WanProxy(echo.address, spec) as proxy, _connect(proxy) as sock:
        # the first ping pays the handshake and the request/response
        first = _ping(sock)
        later = statistics.median(_ping(sock) for _ in range(5))
    assert first == pytest.approx(2 * 0.04, rel=0.10, abs=WAKE_SLACK_S)
    assert later == pytest.approx(0.04, rel=0.10, abs=WAKE_SLACK_S)


def _download(proxy: WanProxy) -> tuple[int, float]:
    """(bytes after the first read, seconds from the first byte to the last)."""
    with _connect(proxy) as sock:
        buf = bytearray(1 << 20)
        assert sock.recv_into(buf) > 0
        started = time.perf_counter()
        total = 0
        while n := sock.recv_into(buf):
            total += n
        return total, time.perf_counter() - started


@pytest.mark.parametrize("rate_bps", [40e6, 200e6])
def test_throughput_matches_the_rate(rate_bps: float) -> None:
    nbytes = int(rate_bps / 8 * 0.8)  # about 0.8 s of traffic
    server = _Server("source", nbytes)
    try:
        with WanProxy(server.address, LinkSpec(rtt_s=0.02, rate_bps=rate_bps)) as proxy:
            got, seconds = _download(proxy)
            stats = proxy.stats()
    finally:
        server.close()
    assert got > 0.9 * nbytes
    assert got * 8 / seconds == pytest.approx(rate_bps, rel=0.10)
    assert stats.down_bytes == nbytes
    assert stats.connections == 1


def test_the_rate_is_shared_by_all_connections() -> None:
    rate = 80e6
    nbytes = int(rate / 8 * 0.4)  # each of two downloads alone would take 0.4 s
    server = _Server("source", nbytes)
    results: list[tuple[int, float]] = []
    try:
        with WanProxy(server.address, LinkSpec(rtt_s=0.01, rate_bps=rate)) as proxy:
            started = time.perf_counter()
            threads = [
                threading.Thread(target=lambda: results.append(_download(proxy))) for _ in range(2)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            elapsed = time.perf_counter() - started
    finally:
        server.close()
    assert len(results) == 2
    assert 2 * nbytes * 8 / elapsed == pytest.approx(rate, rel=0.10)


def test_upload_direction_is_capped_too() -> None:
    rate = 40e6
    sink = _Server("sink")
    payload = os.urandom(int(rate / 8 * 0.6))
    try:
        with WanProxy(sink.address, LinkSpec(rtt_s=0.02, rate_bps=rate)) as proxy:
            with _connect(proxy) as sock:
                started = time.perf_counter()
                sock.sendall(payload)
            deadline = time.monotonic() + 10
            while sink.received < len(payload) and time.monotonic() < deadline:
                time.sleep(0.005)
            elapsed = time.perf_counter() - started
            stats = proxy.stats()
    finally:
        sink.close()
    assert sink.received == len(payload)
    assert stats.up_bytes == len(payload)
    # handshake (1 RTT) and the one-way delay come on top of the transfer time
    transfer = elapsed - 0.02 - 0.01
    assert len(payload) * 8 / transfer == pytest.approx(rate, rel=0.10)


def test_jitter_varies_delay_but_keeps_order_and_bytes(echo: _Server) -> None:
    spec = LinkSpec(rtt_s=0.02, rate_bps=math.inf, jitter_s=0.02)
    payload = os.urandom(3 << 20)
    with WanProxy(echo.address, spec) as proxy:
        rtts = _round_trips(proxy, 15)
        with _connect(proxy) as sock:
            received = bytearray()

            def read() -> None:
                while len(received) < len(payload):
                    chunk = sock.recv(1 << 20)
                    if not chunk:
                        return
                    received.extend(chunk)

            reader = threading.Thread(target=read)
            reader.start()
            sock.sendall(payload)
            reader.join(20)
    assert hashlib.sha256(received).digest() == hashlib.sha256(payload).digest()
    assert min(rtts) >= 0.02 * 0.99
    assert max(rtts) <= (0.02 + 2 * 0.02) * 1.10 + WAKE_SLACK_S  # each direction adds 0..jitter
    assert statistics.pstdev(rtts) > 0.001  # it does vary


def test_blackhole_cut_holds_traffic_until_restore(echo: _Server) -> None:
    with WanProxy(echo.address, LinkSpec(rtt_s=0.01, rate_bps=math.inf)) as proxy:
        with _connect(proxy) as sock:
            _ping(sock)
            proxy.cut()
            assert proxy.stats().cut
            sock.sendall(b"held")
            sock.settimeout(0.3)
            with pytest.raises(TimeoutError):
                sock.recv(10)
            proxy.restore()
            sock.settimeout(10)
            assert sock.recv(10) == b"held"  # same connection, nothing lost
            assert _ping(sock) == pytest.approx(0.01, rel=0.5, abs=0.005)
        assert not proxy.stats().cut


def test_blackhole_cut_also_holds_new_connections(echo: _Server) -> None:
    with WanProxy(echo.address, LinkSpec(rtt_s=0.01, rate_bps=math.inf)) as proxy:
        proxy.cut("blackhole")
        with _connect(proxy) as sock:
            sock.sendall(b"x")
            sock.settimeout(0.3)
            with pytest.raises(TimeoutError):
                sock.recv(10)
            proxy.restore()
            sock.settimeout(10)
            assert sock.recv(10) == b"x"


def test_reset_cut_closes_connections_and_refuses_new_ones(echo: _Server) -> None:
    with WanProxy(echo.address, LinkSpec(rtt_s=0.01, rate_bps=math.inf)) as proxy:
        with _connect(proxy) as sock:
            _ping(sock)
            proxy.cut("reset")
            assert _closed(sock)
        with _connect(proxy) as sock:
            assert _closed(sock, b"x")
        proxy.restore()
        with _connect(proxy) as sock:
            assert _ping(sock) > 0  # works again


def test_set_spec_changes_the_delay(echo: _Server) -> None:
    spec = LinkSpec(rtt_s=0.01, rate_bps=math.inf)
    with WanProxy(echo.address, spec) as proxy, _connect(proxy) as sock:
        _ping(sock)
        proxy.set_spec(LinkSpec(rtt_s=0.05, rate_bps=math.inf))
        rtt = statistics.median(_ping(sock) for _ in range(5))
    assert rtt == pytest.approx(0.05, rel=0.10, abs=WAKE_SLACK_S)


def test_the_server_closing_closes_the_client() -> None:
    server = _Server("source", 1000)
    try:
        with WanProxy(server.address, LinkSpec(rtt_s=0.01, rate_bps=math.inf)) as proxy:
            with _connect(proxy) as sock:
                data = b""
                while chunk := sock.recv(4096):
                    data += chunk
            assert len(data) == 1000
            deadline = time.monotonic() + 5
            while proxy.stats().open_connections and time.monotonic() < deadline:
                time.sleep(0.01)
            assert proxy.stats().open_connections == 0
    finally:
        server.close()


def test_an_unreachable_upstream_closes_the_client() -> None:
    with socket.create_server(("127.0.0.1", 0)) as placeholder:
        address = placeholder.getsockname()  # closed below: nothing listens there
    spec = LinkSpec(rtt_s=0.0, rate_bps=math.inf)
    with WanProxy(address, spec) as proxy, _connect(proxy) as sock:
        assert _closed(sock)


@pytest.mark.parametrize(
    ("text", "bps"),
    [("1Gbit", 1e9), ("100Mbit", 1e8), ("250kbit", 2.5e5), ("1e9", 1e9), ("inf", math.inf)],
)
def test_parse_rate(text: str, bps: float) -> None:
    assert parse_rate(text) == bps


@pytest.mark.parametrize("text", ["", "fast", "-1Gbit", "0", "1Tbit"])
def test_parse_rate_rejects_nonsense(text: str) -> None:
    with pytest.raises(ValueError):
        parse_rate(text)


def test_spec_validation_and_description() -> None:
    with pytest.raises(ValueError):
        LinkSpec(rtt_s=-0.01)
    with pytest.raises(ValueError):
        LinkSpec(rate_bps=0)
    with pytest.raises(ValueError):
        LinkSpec(jitter_s=-1)
    with pytest.raises(ValueError):
        LinkSpec(buffer_bytes=10)
    spec = LinkSpec()
    assert spec.describe() == "50 ms RTT, 1 Gbit/s"
    assert spec.pipe_buffer_bytes >= 2 * spec.rate_bytes_per_s * spec.rtt_s
    assert format_rate(2.5e8) == "250 Mbit/s"
    assert parse_hostport("127.0.0.1:9000") == ("127.0.0.1", 9000)
    with pytest.raises(ValueError):
        parse_hostport("localhost")
