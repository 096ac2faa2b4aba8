"""What an emulated WAN link is (:class:`LinkSpec`: latency, rate, jitter, buffers), its
counters (:class:`LinkStats`), how it is cut (:data:`CutMode`) and the rate syntax
(:func:`parse_rate`, :func:`format_rate`), for :mod:`bench.wan` and its engine
:mod:`bench.wanlink`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

CutMode = Literal["blackhole", "reset"]

READ_BYTES = 256 * 1024
"""Most bytes read from a socket at once; each read crosses the link as one unit."""

MIN_BUFFER_BYTES = 1024 * 1024
"""Least bytes a pipe may hold per connection before the proxy stops reading."""


@dataclass(frozen=True)
class LinkSpec:
    """What the emulated link looks like; the same in both directions.

    Attributes:
        rtt_s: Round-trip time in seconds (each direction adds half of it).
        rate_bps: Capacity in bits per second of each direction, shared by all
            connections; ``math.inf`` for no cap.
        jitter_s: Each unit of data gets an extra one-way delay drawn uniformly from
            ``[0, jitter_s]`` seconds (order within a connection is always kept).
        buffer_bytes: Bytes a pipe holds per connection before the proxy stops reading
            from the sender; ``None`` sizes it to twice the bandwidth-delay product
            (at least :data:`MIN_BUFFER_BYTES`), enough to keep the link full.
        handshake: Charge each new connection one round trip before its first byte
            goes up, as a TCP handshake would.

    Raises:
        ValueError: From ``__post_init__`` on a negative time, a rate that is not
            positive, or a buffer smaller than one read.
    """

    rtt_s: float = 0.050
    rate_bps: float = 1e9
    jitter_s: float = 0.0
    buffer_bytes: int | None = None
    handshake: bool = True

    def __post_init__(self) -> None:
        """Check the settings.

        Raises:
            ValueError: A setting is out of range.
        """
        if not (self.rtt_s >= 0 and math.isfinite(self.rtt_s)):
            raise ValueError(f"rtt_s must be a finite number >= 0, not {self.rtt_s}")
        if not self.rate_bps > 0:
            raise ValueError(f"rate_bps must be > 0, not {self.rate_bps}")
        if not (self.jitter_s >= 0 and math.isfinite(self.jitter_s)):
            raise ValueError(f"jitter_s must be a finite number >= 0, not {self.jitter_s}")
        if self.buffer_bytes is not None and self.buffer_bytes < READ_BYTES:
            raise ValueError(f"buffer_bytes must be >= {READ_BYTES}, not {self.buffer_bytes}")

    @property
    def one_way_s(self) -> float:
        """Propagation delay of one direction, seconds (half the RTT)."""
        return self.rtt_s / 2

    @property
    def rate_bytes_per_s(self) -> float:
        """Capacity of one direction in bytes per second."""
        return self.rate_bps / 8

    @property
    def pipe_buffer_bytes(self) -> int:
        """Bytes one connection may have in one pipe before reading pauses."""
        if self.buffer_bytes is not None:
            return self.buffer_bytes
        if math.isinf(self.rate_bps):
            return 16 * MIN_BUFFER_BYTES
        bdp = self.rate_bytes_per_s * (self.rtt_s + self.jitter_s)
        return max(MIN_BUFFER_BYTES, int(2 * bdp))

    def describe(self) -> str:
        """A short human description, e.g. ``50 ms RTT, 1 Gbit/s``."""
        rate = "unlimited" if math.isinf(self.rate_bps) else format_rate(self.rate_bps)
        text = f"{self.rtt_s * 1000:g} ms RTT, {rate}"
        if self.jitter_s:
            text += f", jitter {self.jitter_s * 1000:g} ms"
        return text


@dataclass(frozen=True)
class LinkStats:
    """Counters of a link since it started.

    Attributes:
        up_bytes: Bytes delivered client → server.
        down_bytes: Bytes delivered server → client.
        connections: Connections accepted.
        open_connections: Connections open now.
        cut: Whether the link is cut now.
    """

    up_bytes: int
    down_bytes: int
    connections: int
    open_connections: int
    cut: bool


def parse_rate(text: str) -> float:
    """Bits per second from ``1Gbit``, ``100Mbit``, ``250kbit``, ``1e9`` or ``inf``.

    Raises:
        ValueError: The text is not a rate.
    """
    units = {"": 1.0, "bit": 1.0, "k": 1e3, "kbit": 1e3, "m": 1e6, "mbit": 1e6}
    units |= {"g": 1e9, "gbit": 1e9}
    match = re.fullmatch(r"\s*([0-9.eE+]+|inf)\s*([a-zA-Z]*?)(?:/s|ps)?\s*", text)
    if not match or match.group(2).lower() not in units:
        raise ValueError(f"not a rate: {text!r} (examples: 1Gbit, 100Mbit, inf)")
    value = float(match.group(1)) * units[match.group(2).lower()]
    if not value > 0:
        raise ValueError(f"rate must be > 0: {text!r}")
    return value


def format_rate(bps: float) -> str:
    """``1 Gbit/s``, ``250 Mbit/s``, ``64 kbit/s``."""
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:g} {unit}"
    return f"{bps:g} bit/s"
