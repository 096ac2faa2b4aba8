"""The pacer: when a batch may leave, how many bytes it may carry, and the stream slots.

* **Demand never waits behind queued work.** A demand batch leaves at once, on a stream of
  its own (``demand_streams`` beyond ``max_streams``), carrying up to ``batch_bytes``; it
  shares the link only with bytes already on the wire.
* **Window.** Any other batch leaves only while the bytes on the wire stay under the link
  window (:attr:`spoke.fetch.window.LinkWindow.bytes`: measured rate × RTT, with a floor
  and a ceiling), carrying a stream's share of it, so the link stays full without a long
  queue in front of the next demand miss; arrived blocks waiting for their disk writes
  count too, against twice the window.
* **Gathering.** Demand misses of many readers share streams: a demand batch leaves at
  once when no demand stream is waiting for its first block (a lone miss pays nothing);
  while one is, further misses gather (the scheduler holds them for at most its gather
  time) and leave together when its first block arrives. On loopback a stream set-up
  cost the hub and the daemon about 1 ms of CPU each, so one stream per miss, not the
  link, set the pace of many small misses.
* **Slots.** A stream holds its slot until its last block has arrived (its disk writes may
  still be running: they are bounded by the admitting bytes, not by the stream count).

The pacer is told the bytes on the wire and being admitted in each call (the flight table
counts them) and feeds the window the fetcher's round-trip and delivery samples.
"""

from __future__ import annotations

from dataclasses import dataclass

from spoke import metrics
from spoke.fetch.priority import Priority
from spoke.fetch.window import LinkWindow


@dataclass(eq=False)
class Stream:
    """One batch on its way.

    Attributes:
        waiting: blocks not arrived yet.
        open: it still holds a slot.
        demand: it carries demand misses.
        answered: its first block arrived (or it ended).
    """

    waiting: int
    open: bool = True
    demand: bool = False
    answered: bool = False


class Pacer:
    """Stream slots and the link window.

    Args:
        window: the link's window estimator (a fresh one by default).
        max_streams: streams open at once for every class.
        demand_streams: further streams only demand misses may open.
        batch_bytes: most bytes in one non-demand stream.
    """

    def __init__(
        self,
        window: LinkWindow | None = None,
        max_streams: int = 8,
        demand_streams: int = 8,
        batch_bytes: int = 16 << 20,
    ) -> None:
        self.window = window or LinkWindow()
        self.max_streams = max_streams
        self.demand_streams = demand_streams
        self.batch_bytes = batch_bytes
        self.busy = 0
        """Stream slots held (streams with blocks still to arrive)."""
        self.unanswered_demand = 0
        """Demand streams waiting for their first block."""

    def room(self, priority: Priority, wire_bytes: int, admitting_bytes: int) -> int | None:
        """Bytes the next batch of ``priority`` may carry now; None: it may not leave yet.

        Args:
            priority: the batch's class.
            wire_bytes: bytes asked of the source and not arrived.
            admitting_bytes: bytes arrived and still being written to the cache.
        """
        if priority == Priority.DEMAND:
            if self.busy >= self.max_streams + self.demand_streams:
                return None
            return self.batch_bytes  # demand ignores the window
        window = self.window.bytes
        per_stream = min(self.batch_bytes, window // self.max_streams)
        # a stream's worth of room, or nothing: a sliver of room would open a stream of
        # one small block, and a round trip per block is what the window is there to
        # avoid. Arrived blocks waiting for their disk writes count too, so a disk slower
        # than the link holds prefetch back instead of filling memory.
        held = wire_bytes + admitting_bytes
        if self.busy >= self.max_streams or (held + per_stream > 2 * window and held > 0):
            return None
        if wire_bytes + per_stream > window and wire_bytes > 0:
            return None
        return per_stream

    @property
    def gathering(self) -> bool:
        """True while demand misses should gather: a demand stream waits for its first
        block, and the misses queued meanwhile can share the next stream."""
        return self.unanswered_demand > 0

    def open(self, blocks: int, demand: bool = False) -> Stream:
        """A batch of ``blocks`` leaves (of demand misses when ``demand``): it takes a slot."""
        self.busy += 1
        if demand:
            self.unanswered_demand += 1
        return Stream(blocks, demand=demand)

    def arrived(self, stream: Stream) -> None:
        """One of ``stream``'s blocks arrived; with its last, its slot frees."""
        self._answered(stream)
        stream.waiting -= 1
        if stream.waiting <= 0:
            self.release(stream)

    def release(self, stream: Stream) -> None:
        """``stream`` holds no slot any more (its last block arrived, or it ended)."""
        self._answered(stream)
        if stream.open:
            stream.open = False
            self.busy -= 1

    def _answered(self, stream: Stream) -> None:
        if stream.demand and not stream.answered:
            self.unanswered_demand -= 1
        stream.answered = True

    def first_bytes(self, seconds: float, nbytes: int) -> None:
        """A stream's first block came back: a round-trip sample, less its transfer time."""
        rate = self.window.rate_bps
        transfer = nbytes / rate if rate else 0.0
        self.window.on_rtt(max(seconds - transfer, seconds / 2))

    def publish(self) -> None:
        """Set the window and link gauges."""
        metrics.WINDOW_BYTES.set(self.window.bytes)
        if (rate := self.window.rate_bps) is not None:
            metrics.LINK_RATE.set(rate)
        if (rtt := self.window.rtt_s) is not None:
            metrics.LINK_RTT.set(rtt)
