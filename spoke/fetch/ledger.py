"""The prefetch ledger: what each prefetch source fetched, whether it was read, and how
much that source may have outstanding now.

Every block fetched ahead of a reader has a **source** (:class:`Source`): a hint stream,
the mount's in-file readahead, its cross-file readahead, or background fill. Per source
the ledger counts bytes *issued* (arrived and cached), *used* (read before eviction) and
*wasted* (evicted, or dropped, unread), and keeps a **window**: the most bytes the source
may have asked for and not yet seen read (queued, on the wire, or cached unread).

The window follows Linux's readahead feedback (mm/readahead.c: a readahead page evicted
before it is read is thrashing, and the next window shrinks to what was actually used;
Fengguang Wu, "On-demand readahead", Linux Symposium 2007) with TCP's shape (additive
increase, multiplicative decrease; Jacobson, "Congestion Avoidance and Control",
SIGCOMM 1988):

* a block evicted unread halves the window; below that block's size it is 0 — the source
  is **off** and every request it makes is dropped;
* a block read grows the window by its size (so a window's worth of use doubles it), up
  to the source's maximum;
* requests dropped while the source is off are remembered (a bounded list of *ghosts*,
  as ARC remembers evicted keys); a reader reading one confirms the source would have
  been right, and opens the window to that block's size. That is the only way an off
  source comes back: on confirmed use, never by itself, and one block at a time (its
  blocks must then be read before they are evicted to grow it further).

The ledger keeps counts and windows only: whether a block was read, in every state, is
its life's (:mod:`spoke.fetch.life`), and the ledger learns of each prefetch's life by
subscribing to it (:meth:`PrefetchLedger.hear`: wanted, claimed by a reader, resident,
streamed through, failed, read after it was cached, evicted unread). Reads of blocks no
life holds reach it from the access log through the scheduler
(:meth:`spoke.fetch.scheduler.FetchScheduler.observe`), for its ghosts.

Everything runs on the daemon's event loop (no locks).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from spoke import metrics
from spoke.fetch.lifestate import Event, Life
from spoke.fetch.priority import Source

GHOSTS = 4096
"""Dropped requests remembered per source (their digests and sizes)."""


@dataclass
class SourceLedger:
    """One source's counts and window.

    Attributes:
        source: whose ledger this is.
        max_bytes: the largest window, bytes (also the first one: a source starts open).
        window: bytes the source may have outstanding now; 0 is off.
        outstanding: bytes asked for and not yet read, evicted or failed.
        issued, used, wasted: bytes, since start.
    """

    source: Source
    max_bytes: int
    window: int = -1  # -1: max_bytes
    outstanding: int = 0
    issued: int = 0
    used: int = 0
    wasted: int = 0
    ghosts: OrderedDict[str, int] = field(default_factory=OrderedDict)

    def __post_init__(self) -> None:
        if self.window < 0:
            self.window = self.max_bytes
        self._publish()

    def allows(self, size: int) -> bool:
        """Whether ``size`` more bytes fit in the window."""
        return self.outstanding + size <= self.window

    def drop(self, digest: str, size: int) -> None:
        """The window refused ``digest``; while the source is off, remember it, for
        :meth:`read_ghost`."""
        if self.window == 0:
            self.ghosts[digest] = size
            self.ghosts.move_to_end(digest)
            while len(self.ghosts) > GHOSTS:
                self.ghosts.popitem(last=False)
        metrics.PREFETCH_SOURCE_BYTES.labels(self.source, "dropped").inc(size)

    def grow(self, size: int) -> None:
        """Confirmed use of ``size`` bytes: the window grows by them."""
        self.window = min(self.max_bytes, self.window + size)
        self._publish()

    def shrink(self, size: int) -> None:
        """``size`` bytes went unread: the window halves, to 0 (off) below ``size``."""
        half = self.window // 2
        self.window = half if half >= size else 0
        self._publish()

    def read_ghost(self, digest: str) -> bool:
        """A reader read ``digest``: if the source is off and had asked for it, open
        the window to its size (True)."""
        size = self.ghosts.pop(digest, None)
        if size is None or self.window > 0:
            return False
        self.grow(size)
        return True

    def _publish(self) -> None:
        metrics.PREFETCH_WINDOW.labels(self.source).set(self.window)


class PrefetchLedger:
    """Every source's ledger.

    One method per event in a prefetch's life (requested, claimed, arrived, discarded,
    released, used, wasted), :meth:`hear` mapping a life's events to them, and the
    questions about it: many small methods, one concern.

    Args:
        max_bytes: each source's largest window, bytes, by source (missing: 256 MiB).
    """

    def __init__(self, max_bytes: dict[Source, int] | None = None) -> None:
        limits = max_bytes or {}
        self.sources = {s: SourceLedger(s, limits.get(s, 256 << 20)) for s in Source}

    def __getitem__(self, source: Source) -> SourceLedger:
        return self.sources[source]

    def allows(self, source: Source, size: int) -> bool:
        """Whether ``source`` may ask for ``size`` more bytes now."""
        return self.sources[source].allows(size)

    def requested(self, source: Source, size: int) -> None:
        """A fetch of ``size`` bytes for ``source`` was queued."""
        self.sources[source].outstanding += size
        metrics.PREFETCH_SOURCE_BYTES.labels(source, "requested").inc(size)

    def released(self, source: Source, size: int) -> None:
        """A queued fetch is no longer the source's (it failed, or was cancelled)."""
        self.sources[source].outstanding -= size

    def claimed(self, source: Source, size: int) -> None:
        """A reader asked for a block the source had queued, before it left: the guess
        was right (the window grows), and the fetch is the reader's now."""
        ledger = self.sources[source]
        ledger.outstanding -= size
        ledger.grow(size)

    def arrived(self, source: Source, size: int, read: bool) -> None:
        """The source's block is cached (or, ``read``, its reader had its bytes): issued;
        used when ``read`` (a reader was already waiting, or read it while it was
        admitted); otherwise its life tells of its first read or its eviction."""
        ledger = self.sources[source]
        ledger.issued += size
        metrics.PREFETCH_BYTES.inc(size)
        metrics.PREFETCH_SOURCE_BYTES.labels(source, "issued").inc(size)
        if read:
            self._used(ledger, size)

    def hear(self, event: Event, life: Life) -> None:
        """A block life's subscriber (:meth:`spoke.fetch.life.BlockLives.subscribe`): count
        what happened to a prefetch's block (lives that are a reader's count nothing)."""
        source = life.prefetch
        if event is Event.CLAIMED:
            assert life.source is not None
            self.claimed(life.source, life.size)
        elif source is None:
            return
        elif event is Event.WANTED:
            self.requested(source, life.size)
        elif event is Event.RESIDENT:
            self.arrived(source, life.size, read=life.read)
        elif event is Event.STREAMED:
            if life.read:
                self.arrived(source, life.size, read=True)
            else:
                self.discarded(source, life.size)
        elif event is Event.FAILED:
            self.released(source, life.size)
        elif event is Event.READ:
            self._used(self.sources[source], life.size)
        elif event is Event.EVICTED:
            self._wasted(self.sources[source], life.size)

    def discarded(self, source: Source, size: int) -> None:
        """The source's block arrived and could not be kept (no room): fetched for
        nothing."""
        ledger = self.sources[source]
        ledger.issued += size
        metrics.PREFETCH_BYTES.inc(size)
        metrics.PREFETCH_SOURCE_BYTES.labels(source, "issued").inc(size)
        self._wasted(ledger, size)

    def note_read(self, digests: Iterable[str]) -> None:
        """Readers read these blocks, none of them a prefetch cached unread (those are
        their lives', :meth:`hear`): dropped requests among them confirm their source."""
        for digest in digests:
            for ledger in self.sources.values():
                if ledger.ghosts and ledger.read_ghost(digest):
                    break

    def snapshot(self) -> dict[str, dict[str, int]]:
        """JSON-ready per source: window, outstanding, issued, used, wasted (bytes)."""
        return {
            s.value: {
                "window_bytes": lg.window,
                "outstanding_bytes": lg.outstanding,
                "issued_bytes": lg.issued,
                "used_bytes": lg.used,
                "wasted_bytes": lg.wasted,
            }
            for s, lg in self.sources.items()
        }

    @staticmethod
    def _used(ledger: SourceLedger, size: int) -> None:
        ledger.outstanding -= size
        ledger.used += size
        metrics.PREFETCH_USED_BYTES.inc(size)
        metrics.PREFETCH_SOURCE_BYTES.labels(ledger.source, "used").inc(size)
        ledger.grow(size)

    @staticmethod
    def _wasted(ledger: SourceLedger, size: int) -> None:
        ledger.outstanding -= size
        ledger.wasted += size
        metrics.PREFETCH_WASTED_BYTES.inc(size)
        metrics.PREFETCH_SOURCE_BYTES.labels(ledger.source, "wasted").inc(size)
        ledger.shrink(size)
