"""How many bytes of prefetch the spoke keeps on the wire: the bandwidth-delay product.

A link of rate *B* and round-trip time *R* is full when *B × R* bytes are in flight; fewer
leave it idle part of every round trip, more only queue (and a demand miss queues behind
them). The window follows BBR's two estimators (Cardwell et al., "BBR: Congestion-Based
Congestion Control", ACM Queue 14(5), 2016): the *maximum* delivery rate seen over the last
few seconds (delivery can only be slower than the link, never faster) and the *minimum*
round-trip time seen over the last ``rtt_span_s`` (queueing only adds delay), times a gain
of 2 so that a window that is still too small grows each round trip, like TCP's slow
start, until the link and not the window is the limit. A floor keeps a fresh spoke (no
samples yet) fetching at a useful rate, and a ceiling bounds memory and the wait a demand
miss can have behind prefetched bytes.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

FLOOR_BYTES = 8 << 20
"""Smallest window: 1.3× the bandwidth-delay product of 1 Gbit/s at 50 ms."""

CEILING_BYTES = 256 << 20
"""Largest window."""

GAIN = 2.0
"""Window = GAIN × max delivery rate × min RTT."""

RATE_SAMPLE_MIN_S = 0.1
"""Shortest span a delivery-rate sample covers, seconds (one RTT when that is longer)."""


class LinkWindow:
    """Delivery-rate and round-trip estimates, and the window they give.

    Args:
        floor: smallest window, bytes.
        ceiling: largest window, bytes.
        rate_span_s: how long a delivery-rate sample counts for the maximum, seconds.
        rtt_span_s: how long an RTT sample counts for the minimum, seconds.
        clock: monotonic seconds (tests pass a fake).

    Raises:
        ValueError: ``floor`` is not positive or exceeds ``ceiling``.
    """

    def __init__(
        self,
        floor: int = FLOOR_BYTES,
        ceiling: int = CEILING_BYTES,
        rate_span_s: float = 3.0,
        rtt_span_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if floor <= 0 or floor > ceiling:
            raise ValueError(f"window floor {floor} must be positive and at most {ceiling}")
        self.floor = floor
        self.ceiling = ceiling
        self.rate_span_s = rate_span_s
        self.rtt_span_s = rtt_span_s
        self._clock = clock
        self._rtts: deque[tuple[float, float]] = deque()  # (when, seconds), ascending seconds
        self._rates: deque[tuple[float, float]] = deque()  # (when, bytes/s), descending rate
        self._deliveries: deque[tuple[float, int]] = deque()  # (when, bytes) of recent arrivals
        self._delivered_recent = 0
        self._since: float | None = None  # the last arrival before the sample's span
        self.delivered_bytes = 0

    # -- samples ---------------------------------------------------------------------------

    def on_rtt(self, seconds: float) -> None:
        """A round trip was measured: request sent → first bytes back, seconds."""
        now = self._clock()
        # a monotonic deque keeps the windowed minimum in O(1) amortised
        while self._rtts and self._rtts[-1][1] >= seconds:
            self._rtts.pop()
        self._rtts.append((now, seconds))

    def on_delivered(self, nbytes: int) -> None:
        """``nbytes`` of block data arrived now (feeds the delivery-rate estimate)."""
        now = self._clock()
        self.delivered_bytes += nbytes
        self._deliveries.append((now, nbytes))
        self._delivered_recent += nbytes
        interval = max(self.rtt_s or 0.0, RATE_SAMPLE_MIN_S)  # a round trip of arrivals at least
        while self._deliveries and now - self._deliveries[0][0] > interval:
            when, expired = self._deliveries.popleft()
            self._delivered_recent -= expired
            self._since = when
        if self._since is not None and now - self._since > 2 * interval:
            self._since = None  # the link was idle: start afresh
        # A sample is the bytes that arrived since an earlier arrival, over the time since
        # it (TCP's delivery-rate sampling: Cheng et al.,
        # draft-cheng-iccrg-delivery-rate-estimation): blocks
        # reach the daemon in bursts whenever its loop was off the CPU, and a span opened
        # by a burst's first block credited the whole burst to a few milliseconds (3-4x
        # the link's rate on a busy 2-core machine, which grew the window far past the
        # bandwidth-delay product and queued that much more before the next demand miss).
        if self._since is None:  # the first arrival opens the span; its bytes came before it
            start, delivered = (
                self._deliveries[0][0],
                self._delivered_recent - self._deliveries[0][1],
            )
        else:
            start, delivered = self._since, self._delivered_recent
        span = now - start
        if span >= interval / 2:
            rate = delivered / span
            while self._rates and self._rates[-1][1] <= rate:
                self._rates.pop()
            self._rates.append((now, rate))

    # -- estimates -------------------------------------------------------------------------

    @property
    def rtt_s(self) -> float | None:
        """Smallest round trip seen within ``rtt_span_s``, seconds (None: no sample)."""
        self._expire(self._rtts, self.rtt_span_s)
        return self._rtts[0][1] if self._rtts else None

    @property
    def rate_bps(self) -> float | None:
        """Largest delivery rate seen within ``rate_span_s``, bytes/s (None: no sample)."""
        self._expire(self._rates, self.rate_span_s)
        return self._rates[0][1] if self._rates else None

    @property
    def bytes(self) -> int:
        """The window: ``GAIN × rate × RTT`` within [floor, ceiling], bytes."""
        rtt, rate = self.rtt_s, self.rate_bps
        if rtt is None or rate is None:
            return self.floor
        return int(min(self.ceiling, max(self.floor, GAIN * rate * rtt)))

    def _expire(self, samples: deque[tuple[float, float]], span: float) -> None:
        now = self._clock()
        while samples and now - samples[0][0] > span:
            samples.popleft()
