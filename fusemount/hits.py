"""Hits gathered on the mount's event loop and reported to the daemon in batches.

The daemon's eviction policy must see every access, but one report per read would cost a
gRPC call per FUSE request. Hits are appended to a list — touched only from the trio loop,
so it needs no lock — and one task reports them (``RecordAccess``) every ``interval``
seconds or as soon as :data:`HIT_BATCH` have gathered. While the daemon's last answer said
``prompt`` (a read-order hint is installed) hits go out as they happen instead: one report
in flight, the next, at least :data:`PROMPT_INTERVAL` after it began, carrying whatever
gathered meanwhile, so the hint's cursors follow the reads. A lost report only costs
recency accuracy.
"""

from __future__ import annotations

import logging

import trio

from fusemount.client import DaemonClient
from fusemount.readerrors import give_back_read_errors, take_read_errors

HIT_BATCH = 1024  # hits that make a report go out before its interval is up

PROMPT_INTERVAL = 0.01
"""Shortest time from one prompt report to the next, seconds. Reporting each hit the
moment the last report returned made about a thousand RecordAccess calls a second while
a trainer read (every 128 KiB FUSE read is a hit), which cost the mount and the daemon
about 3 s of CPU per 100 training steps; a hint's prefetch window is seconds long, so
following the reads to within 10 ms loses nothing."""

log = logging.getLogger(__name__)


class HitLog:
    """The batch of hits not yet reported (loop-only state).

    Args:
        client: the daemon connection; its ``prompt`` flag says whether to report at once.
    """

    def __init__(self, client: DaemonClient) -> None:
        self.client = client
        self.count = 0  # hits since start
        self._batch: list[str] = []
        self._full = trio.Event()

    def add(self, digest: str) -> None:
        """Record one hit of block ``digest`` (call from the trio loop)."""
        self.count += 1
        batch = self._batch
        batch.append(digest)
        if len(batch) >= HIT_BATCH or self.client.prompt:
            self._full.set()

    def take(self) -> list[str]:
        """The hits since the last call (the next report's batch)."""
        batch, self._batch = self._batch, []
        return batch

    async def report_forever(self, interval: float = 0.1) -> None:
        """Report batches until cancelled: every ``interval`` seconds, or at once when full."""
        while True:
            with trio.move_on_after(interval):
                await self._full.wait()
            self._full = trio.Event()
            started = trio.current_time()
            await self.report()
            if self.client.prompt:
                await trio.sleep_until(started + PROMPT_INTERVAL)

    async def report(self) -> None:
        """Report the hits gathered so far, and the reads failed with EIO since the last
        report; a failed report is logged and dropped (its failed reads are told again)."""
        batch = self.take()
        errors = take_read_errors()
        if not batch and not errors:
            return
        try:
            await trio.to_thread.run_sync(self.client.record_access, batch, errors)
        except Exception as err:  # the daemon may be restarting; recency is advisory
            log.debug("could not report %d hits: %s", len(batch), err)
            give_back_read_errors(errors)
            return
        if len(self._batch) >= self._report_after():  # gathered while this one was out
            self._full.set()

    def _report_after(self) -> int:
        """Hits that make a report go out now: 1 while the daemon asks for prompt reports."""
        return 1 if self.client.prompt else HIT_BATCH
