"""Following read-order hints, for :class:`spoke.cache.hinted.HintedPolicy` (its base):
installing and removing streams (:meth:`HintFollower.set_hint`,
:meth:`HintFollower.clear_hint`), matching each read to the stream that expects it soonest
(:meth:`HintFollower.observe`), the blocks readers hold, and the streams' shared clock
that predicts every block's next use. Placing the resident blocks by those predictions,
and evicting, is :mod:`spoke.cache.hinted`'s.

Streams share one clock, counted in reads (every read that counts for some stream ticks
it). Streams are assumed to read at the same speed, as the ranks of one DDP job do (they
meet at every optimizer step): with ``n`` streams each is predicted to advance one
position every ``n`` ticks, and a block's next use is the earliest prediction over the
streams that read it. When a stream runs ahead of or behind its prediction by more than
``2 x tolerance`` positions, every stream is predicted afresh from where it is and the
next uses recomputed (at most once per ``max(tolerance, resident blocks / 16)`` reads, so
the cost stays a few next-use lookups per read). Measuring each stream's speed instead was
tried and lost: hit reports arrive in batches, so speeds measured over short windows are
noise.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from spoke.cache.hintplan import HintPlan
from spoke.cache.hintstream import NEVER, HintStream
from spoke.cache.policy import EvictionPolicy

DEFAULT_STREAM = "default"


class HintFollower:
    """The streams half of :class:`~spoke.cache.hinted.HintedPolicy`, which sets every
    attribute below in its constructor and places blocks by :meth:`next_use` in the three
    hooks (each call here that changes a prediction calls one of them)."""

    inner: EvictionPolicy
    tolerance: int
    in_use: int
    streams: dict[str, HintStream]
    clock: int  # reads counted for some stream
    _recent: OrderedDict[str, None]  # latest reads, being read
    _held: dict[str, int]  # digest -> readers waiting for it (hold/release)
    _synced_at: int  # clock of the last speed measurement

    def _refresh(self, digest: str) -> None:
        """Recompute a resident block's next use (the policy's)."""
        raise NotImplementedError

    def _recompute_all(self) -> None:
        """Recompute every resident block's next use (the policy's)."""
        raise NotImplementedError

    def _follow_streams(self) -> None:
        """Make or drop what the policy keeps while a stream is installed."""
        raise NotImplementedError

    @property
    def active(self) -> bool:
        """True while some stream is installed."""
        return bool(self.streams)

    def stream(self, name: str = DEFAULT_STREAM) -> HintStream | None:
        """The installed stream ``name``, if any."""
        return self.streams.get(name)

    def set_hint(
        self,
        digests: Sequence[str] | HintPlan,
        append: bool = False,
        stream: str = DEFAULT_STREAM,
    ) -> HintStream | None:
        """Install ``digests`` (or a prepared :class:`HintPlan`, :mod:`spoke.cache.hintplan`)
        as stream ``stream``'s planned read order.

        Replacing (or creating) starts the stream's cursor at its first position, expected
        now; ``append`` extends the stream instead. An empty replacement removes the
        stream. Every stream is predicted afresh from where it is.

        Returns:
            The stream, or None when it was removed.
        """
        current = self.streams.get(stream)
        if append and current is not None:
            current.extend(digests)
        elif not digests:
            self.streams.pop(stream, None)
            current = None
        else:
            self.streams.pop(stream, None)
            current = HintStream(stream, self.tolerance)
            current.extend(digests)
            self.streams[stream] = current
        self._follow_streams()
        self._resync()
        return current

    def clear_hint(self, stream: str | None = None) -> bool:
        """Remove one stream (None: all); returns whether anything was removed. With no
        stream left, eviction is the wrapped policy's again."""
        if stream is None:
            removed = bool(self.streams)
            self.streams.clear()
        else:
            removed = self.streams.pop(stream, None) is not None
        if removed:
            self._recent.clear()
            self._follow_streams()
            self._recompute_all()
        return removed

    def mentioned(self, digest: str) -> bool:
        """True when a kept plan of some stream reads ``digest`` (read or not yet)."""
        return any(s.mentions(digest) for s in self.streams.values())

    def next_use(self, digest: str) -> float:
        """Clock time of ``digest``'s next planned read over every stream, or :data:`NEVER`."""
        best: float = NEVER
        for s in self.streams.values():
            pos = s.next_use(digest)
            if pos != NEVER:
                best = min(best, s.when(pos))
        return best

    def upcoming(self, count: int) -> list[tuple[float, str]]:
        """Up to ``count`` unread planned reads per stream as ``(clock time, digest)``,
        soonest first, each digest once."""
        return [(when, digest) for when, digest, _ in self.upcoming_blocks(count)]

    def upcoming_blocks(self, count: int) -> list[tuple[float, str, int]]:
        """As :meth:`upcoming`, with each block's planned size (bytes; 0: not given)."""
        merged = sorted(
            (s.when(pos), digest, size)
            for s in self.streams.values()
            for pos, digest, size in s.upcoming_blocks(count)
        )
        seen: set[str] = set()
        out: list[tuple[float, str, int]] = []
        for when, digest, size in merged:
            if digest not in seen:
                seen.add(digest)
                out.append((when, digest, size))
        return out

    def observe(self, digest: str) -> HintStream | None:
        """A reader read ``digest`` (hit or miss): move the cursor of the stream whose plan
        it matches best (the one that expects it soonest).

        Returns:
            The stream the read counted for, or None when it matched no stream's plan.
        """
        best: HintStream | None = None
        best_distance = 0
        for s in self.streams.values():
            distance = s.distance(digest)
            if distance is not None and (best is None or distance < best_distance):
                best, best_distance = s, distance
        if best is None:
            return None
        changed = best.observe(digest) or []
        self.clock += 1
        if self.in_use:
            self._recent[digest] = None
            self._recent.move_to_end(digest)
            while len(self._recent) > self.in_use * len(self.streams):
                old, _ = self._recent.popitem(last=False)
                changed.append(old)
        drift = abs(best.head - best.predicted_head(self.clock))
        if drift > 2 * self.tolerance and self.clock - self._synced_at >= max(
            self.tolerance, len(self.inner) // 16
        ):
            self._resync()  # recomputes every next use
        else:
            for key in changed:
                self._refresh(key)
        return best

    def hold(self, digests: Iterable[str]) -> None:
        """Readers wait for these blocks: never evict them until :meth:`release`."""
        for digest in digests:
            self._held[digest] = self._held.get(digest, 0) + 1
            self._refresh(digest)

    def release(self, digests: Iterable[str]) -> None:
        """Undo one :meth:`hold` of each digest."""
        for digest in digests:
            left = self._held.get(digest, 0) - 1
            if left > 0:
                self._held[digest] = left
            else:
                self._held.pop(digest, None)
            self._refresh(digest)

    def _resync(self) -> None:
        """Predict every stream from where it is now, at a fair share of the reads each,
        and recompute every resident block's next use."""
        now = self.clock
        fair = 1.0 / max(1, len(self.streams))
        for s in self.streams.values():
            s.t0, s.p0, s.rate = now, s.head, fair
        self._synced_at = now
        self._recompute_all()
