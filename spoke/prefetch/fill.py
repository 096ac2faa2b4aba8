"""Background fill: once a snapshot is being read, fetch the rest of it at the lowest
priority, so a job that started cold ends up reading at local speed (SOCI and stargz fetch
the rest of an image in the background after a lazy start the same way).

A snapshot qualifies when the mount has loaded its manifest, a reader has read one of its
blocks, and its distinct blocks fit in ``share`` of the cache. Its missing blocks are then
fetched as :attr:`Priority.FILL`, a few batches at a time, in manifest order:

* **Yields to everything.** Fill is the scheduler's last class: demand misses leave at
  once beside it, and it only gets window the other classes leave.
* **Never evicts.** A batch goes out only if it fits in the room below the cache's high
  watermark (less what is already on the way), so fill never makes the evictor take a
  pinned, hinted or recently read block; when the room runs out the fill stops, says so
  (``state: stopped``, a log line) and looks again every ``recheck_s``. Its blocks wait
  at the policy's cold end until read, so later misses evict them first.
* **Feedback.** Fill is a prefetch source in the ledger (:mod:`spoke.fetch.ledger`): filled
  blocks evicted unread shrink its window, and a batch that does not fit in the window
  stops the fill the same way, until readers reading what it dropped open it again.
* **Waits for hints.** While a read-order hint is installed the hint prefetcher owns the
  free room; fill waits.
* **Survives link cuts.** A batch the hub cannot deliver before the miss deadline is
  retried after a pause; nothing is lost, the fill resumes by itself.
* ``rate_bps`` caps its average rate (a token bucket), e.g. for a shared uplink.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from spoke import metrics
from spoke.cache.blockcache import BlockCache
from spoke.catalog.snapshots import SnapshotIndex
from spoke.errors import HubUnavailable, SpokeError
from spoke.fetch.priority import Source
from spoke.fetch.scheduler import FetchScheduler, Priority
from spoke.prefetch.prewarm import fetch_batches

log = logging.getLogger(__name__)

FillMode = Literal["auto", "off"]
FillState = Literal["filling", "waiting", "stopped", "done", "failed", "too large"]

_ACTIVE = ("filling", "waiting", "stopped")

BATCH_BYTES = 8 << 20
"""Most bytes per fill batch."""

PARALLEL_BATCHES = 4
"""Fill batches queued at once (the scheduler sends what its window allows)."""


@dataclass
class Fill:
    """One snapshot's fill, as ``GET /v1/cache`` shows it."""

    key: str
    bytes_total: int
    bytes_resident: int = 0
    bytes_filled: int = 0
    state: FillState = "filling"
    reason: str = ""
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None
    passes: int = 0  # passes of the fill loop over this snapshot that have ended
    counted: float = field(default=float("-inf"), repr=False)  # when status last counted
    logged: str = field(default="", repr=False)  # the last state said in the log

    def say(self, state: FillState, reason: str) -> None:
        """Change state; a new kind of state is logged once, not on every recheck."""
        self.state, self.reason = state, reason
        if state != self.logged:
            self.logged = state
            level = logging.INFO if state in ("filling", "done", "too large") else logging.WARNING
            log.log(
                level, "background fill of %s: %s%s", self.key, state, f" ({reason})" * bool(reason)
            )

    @property
    def rate_bps(self) -> float:
        """Bytes filled per second since the fill started."""
        elapsed = (self.finished or time.monotonic()) - self.started
        return self.bytes_filled / elapsed if elapsed > 0 else 0.0

    def public(self) -> dict[str, object]:
        """JSON-ready progress: bytes, rate (bytes/s), ETA (s), state and why, and how many
        passes (a first one, then one per recheck) have ended."""
        rate = self.rate_bps
        left = self.bytes_total - self.bytes_resident
        return {
            "snapshot": self.key,
            "state": self.state,
            "reason": self.reason or None,
            "bytes_total": self.bytes_total,
            "bytes_resident": self.bytes_resident,
            "bytes_filled": self.bytes_filled,
            "bytes_remaining": left,
            "rate_bytes_per_s": round(rate),
            "eta_s": round(left / rate, 1) if rate > 0 and self.state == "filling" else None,
            "passes": self.passes,
        }


class BackgroundFill:
    """Fills snapshots being read into the cache at the lowest priority.

    Args:
        index: the loaded manifests (which snapshot a block belongs to).
        scheduler: fetches go out as :attr:`Priority.FILL`.
        cache: where blocks go; its room below the high watermark bounds the fill.
        mode: ``auto`` fills qualifying snapshots, ``off`` never.
        rate_bps: most bytes per second on average (None: as fast as the link allows).
        share: a snapshot qualifies if its blocks fit in this fraction of the cache.
        paused: while it returns True no batch starts (a read-order hint is installed).
        recheck_s: how often a stopped or waiting fill looks again, seconds.

    Raises:
        ValueError: ``share`` outside (0, 1], or ``rate_bps`` not positive.
    """

    def __init__(
        self,
        index: SnapshotIndex,
        scheduler: FetchScheduler,
        cache: BlockCache,
        mode: FillMode = "auto",
        rate_bps: float | None = None,
        share: float = 0.5,
        paused: Callable[[], bool] = lambda: False,
        recheck_s: float = 2.0,
    ) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"fill share must be in (0, 1], got {share}")
        if rate_bps is not None and rate_bps <= 0:
            raise ValueError(f"fill rate must be positive, got {rate_bps}")
        self.index = index
        self.scheduler = scheduler
        self.cache = cache
        self.mode = mode
        self.rate_bps = rate_bps
        self.share = share
        self.recheck_s = recheck_s
        self._paused = paused
        self.fills: dict[str, Fill] = {}
        self._wake = asyncio.Event()
        self._submitted = 0  # bytes handed to the scheduler (the rate limit's count)
        self._since = time.monotonic()

    def describe(self) -> str:
        """One line for the start-up log: what the fill will fetch and how to turn it off."""
        if self.mode == "off":
            return "background fill off: only blocks that are read (and prefetched) are fetched"
        limit = int(self.share * self.cache.capacity_bytes)
        rate = f", at most {self.rate_bps / 2**20:,.1f} MiB/s" if self.rate_bps else ""
        return (
            f"background fill on: once a snapshot is read, the rest of it is fetched at the "
            f"lowest priority if it is at most {limit:,} bytes ({self.share:.0%} of the "
            f"cache){rate}; --background-fill off turns it off"
        )

    # -- hearing of reads ------------------------------------------------------------------

    def observe(self, digests: Sequence[str], hit: bool) -> None:
        """An access-log subscriber: a read of a loaded snapshot's block starts its fill."""
        if self.mode == "off":
            return
        for digest in digests:
            for snapshot in self.index.lookup(digest):
                if snapshot.key in self.fills:
                    continue
                total = snapshot.total_bytes
                fill = Fill(snapshot.key, total, bytes_resident=self._resident(snapshot.sizes))
                limit = int(self.share * self.cache.capacity_bytes)
                if total > limit:
                    fill.say(
                        "too large",
                        f"{total:,} bytes is more than {self.share:.0%} of the cache "
                        f"({limit:,} bytes; a larger --cache-size or --fill-share lets it fill)",
                    )
                else:
                    coming = sum(  # the reads' own misses are on their way already
                        s for d, s in snapshot.sizes.items() if self.scheduler.is_fetching(d)
                    )
                    left = max(0, total - fill.bytes_resident - coming)
                    fill.say(
                        "filling",
                        f"{left:,} of {total:,} bytes to fetch over the link; "
                        "--background-fill off turns it off",
                    )
                self.fills[snapshot.key] = fill
                self._wake.set()

    def _resident(self, sizes: Mapping[str, int]) -> int:
        return sum(s for d, s in sizes.items() if self.cache.contains(d))

    # -- the fill loop ---------------------------------------------------------------------

    async def run(self) -> None:
        """Fill qualifying snapshots, one at a time, until cancelled."""
        while True:
            fill = next((f for f in self.fills.values() if f.state in _ACTIVE), None)
            if fill is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            await self._fill(fill)
            fill.passes += 1
            if fill.state in ("stopped", "waiting"):  # look again in a while
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.recheck_s)
                self._wake.clear()

    async def _fill(self, fill: Fill) -> None:
        snapshot = self.index.get(fill.key)
        if snapshot is None:  # the mount no longer has it loaded
            fill.say("failed", "snapshot no longer loaded")
            return
        missing = [(d, s) for d, s in snapshot.sizes.items() if not self.cache.contains(d)]
        fill.bytes_resident = fill.bytes_total - sum(s for _, s in missing)
        # blocks already on their way (a reader's miss, readahead) are not fill's to count
        missing = [(d, s) for d, s in missing if not self.scheduler.is_fetching(d)]
        self._publish()
        if self._paused():
            fill.say("waiting", "a read-order hint is installed")
            return
        batches = fetch_batches(missing, most_blocks=None, most_bytes=BATCH_BYTES)
        self._submitted, self._since = 0, time.monotonic()  # the rate limit counts per pass
        running: set[asyncio.Task[None]] = set()
        complete = False
        try:
            for batch in batches:
                while len(running) >= PARALLEL_BATCHES:
                    done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                    for task in done:
                        task.result()
                if self._paused():
                    fill.say("waiting", "a read-order hint is installed")
                    break
                size = sum(s for _, s in batch)
                room = self.cache.high_bytes - self.cache.used_bytes
                room -= self.scheduler.on_the_way_bytes
                if size > room:
                    fill.say(
                        "stopped",
                        f"cache under pressure: {max(0, room):,} bytes free below the high "
                        f"watermark, the next batch needs {size:,}",
                    )
                    break
                ledger = self.scheduler.ledger[Source.FILL]
                if not ledger.allows(size):
                    for digest, nbytes in batch:
                        ledger.drop(digest, nbytes)
                    fill.say(
                        "stopped",
                        f"filled blocks were evicted unread ({ledger.wasted:,} bytes): "
                        f"fill's window is {ledger.window:,} bytes, the next batch needs "
                        f"{size:,}",
                    )
                    break
                if fill.state != "filling":
                    fill.say("filling", "resumed")
                await self._pace(size)
                task = asyncio.create_task(self._batch(fill, batch))
                running.add(task)
            else:
                complete = True
            if running:
                await asyncio.gather(*running)
            running.clear()
        except HubUnavailable as err:
            fill.say("waiting", f"hub unavailable ({err}); retrying")
        except SpokeError as err:
            fill.say("failed", str(err))
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
        if complete and not running and fill.state in _ACTIVE:
            resident = sum(s for d, s in snapshot.sizes.items() if self.cache.contains(d))
            fill.bytes_resident = resident
            if resident >= fill.bytes_total:
                fill.finished = time.monotonic()
                fill.say("done", f"{fill.bytes_filled:,} bytes filled")
            else:  # streamed through (disk full) or evicted at once: try again later
                fill.say("stopped", f"{fill.bytes_total - resident:,} bytes did not stay cached")
        self._publish()

    async def _batch(self, fill: Fill, batch: list[tuple[str, int]]) -> None:
        was_cached, _ = await self.scheduler.ensure(batch, Priority.FILL, Source.FILL)
        filled = sum(s for (_, s), c in zip(batch, was_cached, strict=True) if not c)
        fill.bytes_filled += filled
        fill.bytes_resident += filled
        metrics.FILL_BYTES.inc(filled)
        metrics.FILL_RATE.set(fill.rate_bps)
        self._publish()

    async def _pace(self, nbytes: int) -> None:
        """Sleep until ``nbytes`` more keep the average at or under ``rate_bps``."""
        if self.rate_bps is None:
            return
        now = time.monotonic()
        self._submitted += nbytes
        ahead = self._submitted / self.rate_bps - (now - self._since)
        if ahead > 0:
            await asyncio.sleep(ahead)

    def _publish(self) -> None:
        active = [f for f in self.fills.values() if f.state != "too large"]
        metrics.FILL_REMAINING_BYTES.set(sum(f.bytes_total - f.bytes_resident for f in active))

    def status(self) -> dict[str, object]:
        """JSON-ready: mode, rate limit and every fill, newest last. A snapshot too large to
        fill has its resident bytes counted again here (at most once a second each): no
        fill pass counts them for it."""
        now = time.monotonic()
        for fill in self.fills.values():
            snapshot = self.index.get(fill.key)
            if fill.state == "too large" and snapshot is not None and now - fill.counted >= 1.0:
                fill.bytes_resident, fill.counted = self._resident(snapshot.sizes), now
        return {
            "mode": self.mode,
            "rate_limit_bytes_per_s": self.rate_bps,
            "snapshots": [f.public() for f in self.fills.values()],
        }
