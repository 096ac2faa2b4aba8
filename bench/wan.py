"""A WAN emulator: a userspace TCP proxy with latency, a bandwidth cap, jitter and a kill switch.

    python -m bench.wan --listen 127.0.0.1:9000 --upstream 127.0.0.1:50051 \\
        [--rtt-ms 50] [--rate 1Gbit] [--jitter-ms 0]

Clients connect to the proxy instead of the server; every byte crosses an emulated link
made of two one-way pipes (client → server "up", server → client "down"). Each pipe is a
bottleneck of ``rate`` shared by all connections (a byte leaves after the bytes queued
before it, at the link rate) followed by a propagation delay of half the round-trip time,
plus an optional random jitter that never reorders a connection's bytes. A new connection
also pays one round trip before its first byte goes up (the TCP handshake), so a protocol
that opens many short connections is charged as it would be on a real WAN.

What it does not emulate: packet loss and TCP congestion control (slow start, the
congestion window). The proxy ends TCP on both sides on loopback, so figures through it
are what a perfectly tuned TCP could get from the link, an upper bound on a real WAN;
flow control above TCP (HTTP/2 windows, request/response round trips) is emulated
faithfully, because its messages cross the same delayed pipes.

:meth:`~bench.wanlink.WanLink.cut` takes the link down and ``restore`` brings it back. A
``"blackhole"`` cut (a pulled cable) holds every byte and every new connection until the
link returns, then delivers them in order; a ``"reset"`` cut (a restarted middlebox)
aborts every open connection and refuses new ones.

Two ways to run it: :class:`~bench.wanlink.WanLink` on the caller's asyncio loop (``async
with``), or :class:`WanProxy`, the same link on a background thread for synchronous code::

    with WanProxy(("127.0.0.1", hub_port), LinkSpec(rtt_s=0.05, rate_bps=1e9)) as wan:
        run_spoke(hub=wan.address)   # "127.0.0.1:<port>"
        wan.cut(); ...; wan.restore()
        print(wan.stats().down_bytes)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import threading
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TypeVar

from bench.wanlink import WanLink
from bench.wanspec import CutMode, LinkSpec, LinkStats, format_rate, parse_rate
from protocol import address

# The emulator's public face: the link's description comes from bench.wanspec, but the
# benchmarks, the demo and the tests (a dozen sites) import it from here with the proxy.
__all__ = [
    "CutMode",
    "LinkSpec",
    "LinkStats",
    "WanProxy",
    "format_rate",
    "parse_hostport",
    "parse_rate",
]

_T = TypeVar("_T")


class WanProxy:
    """A :class:`WanLink` on its own event loop thread, for synchronous code.

    Args:
        upstream: The server's ``(host, port)``.
        spec: Latency, rate and jitter.
        listen: Where the proxy listens; port 0 picks a free port.

    Every method is safe to call from any thread. Use it as a context manager, or call
    :meth:`start` and :meth:`close`.
    """

    def __init__(
        self,
        upstream: tuple[str, int],
        spec: LinkSpec | None = None,
        listen: tuple[str, int] = ("127.0.0.1", 0),
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._link = WanLink(upstream, spec, listen)
        self._thread = threading.Thread(target=self._loop.run_forever, name="wan", daemon=True)
        self._started = False

    def __enter__(self) -> WanProxy:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _call(self, fn: Callable[[], Awaitable[_T]], timeout: float = 10.0) -> _T:
        async def run() -> _T:
            return await fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    def _sync(self, fn: Callable[[], _T]) -> _T:
        async def run() -> _T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10.0)

    def start(self) -> None:
        """Start the thread and listen.

        Raises:
            OSError: The listen address cannot be bound.
        """
        self._thread.start()
        self._started = True
        try:
            self._call(self._link.start)
        except BaseException:
            self.close()
            raise

    @property
    def spec(self) -> LinkSpec:
        """The link's settings now."""
        return self._link.spec

    @property
    def port(self) -> int:
        """The port the proxy listens on."""
        return self._link.port

    @property
    def address(self) -> str:
        """``HOST:PORT`` to give clients instead of the upstream server's."""
        return self._link.address

    def set_spec(self, spec: LinkSpec) -> None:
        """See :meth:`WanLink.set_spec`."""
        self._sync(lambda: self._link.set_spec(spec))

    def cut(self, mode: CutMode = "blackhole") -> None:
        """See :meth:`WanLink.cut`."""
        self._sync(lambda: self._link.cut(mode))

    def restore(self) -> None:
        """See :meth:`WanLink.restore`."""
        self._sync(self._link.restore)

    def stats(self) -> LinkStats:
        """See :meth:`WanLink.stats`."""
        return self._sync(self._link.stats)

    def close(self) -> None:
        """Abort every connection, stop listening and end the thread (idempotent)."""
        if not self._started:
            return
        self._started = False
        with contextlib.suppress(Exception):
            self._call(self._link.aclose)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10.0)
        if not self._thread.is_alive():
            self._loop.close()


def parse_hostport(text: str) -> tuple[str, int]:
    """``("127.0.0.1", 9000)`` from ``127.0.0.1:9000`` (:func:`protocol.address.parse_hostport`;
    a missing host is 127.0.0.1).

    Raises:
        ValueError: The text is not HOST:PORT.
    """
    return address.parse_hostport(text, default_host="127.0.0.1")


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.wan``: run a proxy until SIGINT/SIGTERM; prints its address."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.wan",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT (default: free)")
    parser.add_argument("--upstream", required=True, help="the server's HOST:PORT")
    parser.add_argument("--rtt-ms", type=float, default=50.0)
    parser.add_argument("--rate", default="1Gbit", help="e.g. 1Gbit, 100Mbit, inf")
    parser.add_argument("--jitter-ms", type=float, default=0.0)
    ns = parser.parse_args(argv)
    try:
        spec = LinkSpec(ns.rtt_ms / 1000, parse_rate(ns.rate), ns.jitter_ms / 1000)
        listen, upstream = parse_hostport(ns.listen), parse_hostport(ns.upstream)
    except ValueError as err:
        parser.error(str(err))
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with WanProxy(upstream, spec, listen) as wan:
        print(f"{wan.address} -> {ns.upstream} ({spec.describe()})", flush=True)
        while not stop.wait(1.0):
            pass
        stats = wan.stats()
    print(f"up {stats.up_bytes:,} B, down {stats.down_bytes:,} B, {stats.connections} conns")
    return 0


if __name__ == "__main__":
    sys.exit(main())
