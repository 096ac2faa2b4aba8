"""A connection-rate flood and a kubelet-style probe, for the HTTP ports that cap their
connections (the spoke's admin and ``--metrics`` ports, the hub's metrics port): the
twelfth probe opened silent connections at 50-100 a second, each held 3 s, and a cap that
displaced only connections a second old kept every probe out."""

from __future__ import annotations

import socket
import threading
import time

import httpx


class ConnectionFlood:
    """Opens connections to ``host:port`` at ``rate`` a second that send nothing, each held
    ``hold_s`` seconds, from a thread, while the ``with`` block runs.

    Args:
        host, port: The server.
        rate: Connections opened a second.
        hold_s: How long each is held open, seconds.
    """

    def __init__(self, host: str, port: int, rate: float, hold_s: float) -> None:
        self._address = (host, port)
        self._rate = rate
        self._hold_s = hold_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.opened = 0

    def __enter__(self) -> ConnectionFlood:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        held: list[tuple[float, socket.socket]] = []
        start = time.monotonic()
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                while held and held[0][0] <= now:
                    held.pop(0)[1].close()
                if self.opened < (now - start) * self._rate:
                    try:
                        sock = socket.create_connection(self._address, timeout=1)
                    except OSError:
                        continue
                    held.append((now + self._hold_s, sock))
                    self.opened += 1
                else:
                    time.sleep(0.002)
        finally:
            for _, sock in held:
                sock.close()


def kubelet(url: str, probes: int, every_s: float, timeout_s: float = 1.0) -> list[bool]:
    """``probes`` ``GET url`` every ``every_s`` seconds with a ``timeout_s`` timeout, as the
    kubelet probes liveness: whether each got 200."""
    got = []
    for _ in range(probes):
        began = time.monotonic()
        try:
            got.append(httpx.get(url, timeout=timeout_s).status_code == 200)
        except httpx.HTTPError:
            got.append(False)
        time.sleep(max(0.0, every_s - (time.monotonic() - began)))
    return got


def longest_failing_run(results: list[bool]) -> int:
    """The most failures in a row in ``results``."""
    longest = run = 0
    for ok in results:
        run = 0 if ok else run + 1
        longest = max(longest, run)
    return longest
