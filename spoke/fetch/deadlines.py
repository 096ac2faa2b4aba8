"""Every deadline a fetch has, in one place (:class:`Deadlines`, owned by the fetcher).

* **A batch** keeps retrying, with exponential backoff and jitter (tenacity), until the
  miss deadline; each attempt is one stream whose own deadline is the stream timeout or
  what is left of the miss deadline, whichever is sooner (:meth:`Deadlines.attempts`).
* **A reader** waits at most its own miss deadline, from when it asked
  (:class:`ReaderWait`): a fetch it joined that started earlier and ran out of time is
  followed by one of its own while it still has time.
* **A probe.** A miss that gave up at its deadline is remembered for
  :data:`GAVE_UP_MEMORY_S`, while nothing has arrived from the source since; a new miss of
  that block then waits only :data:`PROBE_S` (at most a quarter of the miss deadline), and
  its fetch goes on with the full deadline for later readers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable

from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential_jitter,
)

from spoke.errors import CorruptBlock, HubUnavailable, MissDeadline

GAVE_UP_MEMORY_S = 0.5
"""How long a miss that gave up at its deadline shortens new misses of that block to a
probe, while nothing has arrived from the source since. The kernel asks again at once
(within milliseconds) for a failed readahead page: without this every failed read took two
miss deadlines. Kept short, so a reader that tries again later (the hub may be back, its
connection still in reconnect backoff) gets a full deadline."""

PROBE_S = 1.0
"""Longest wait of such a probe (at most a quarter of the miss deadline): its fetch goes on
with the full deadline for later readers, and a hub that came back answers it in time."""

GAVE_UP_KEPT = 4096
"""Most blocks whose give-up is remembered (the oldest are forgotten first)."""

RETRIED = (HubUnavailable, CorruptBlock)
"""Errors another attempt may cure."""


class Deadlines:
    """The miss deadline and everything timed by it: a batch's attempts, a reader's wait,
    and the probe after a give-up.

    Args:
        miss_deadline: how long a batch may keep retrying, and a reader wait, seconds.
        stream_timeout: deadline of one stream, seconds.
    """

    def __init__(self, miss_deadline: float = 60.0, stream_timeout: float = 60.0) -> None:
        self.miss_deadline = miss_deadline
        self.stream_timeout = stream_timeout
        self._gave_up: dict[str, tuple[float, MissDeadline]] = {}  # digest -> when, why
        self._last_arrival = float("-inf")  # monotonic time a block last arrived

    def attempts(self) -> tuple[AsyncRetrying, Callable[[], float]]:
        """A batch's attempts, starting now: the retrying loop (it re-raises the last
        :data:`RETRIED` error at the miss deadline), and the deadline of the next stream,
        seconds (no attempt outlives the miss deadline: a silent link)."""
        deadline = time.monotonic() + self.miss_deadline

        def stream_timeout() -> float:
            return max(min(self.stream_timeout, deadline - time.monotonic()), 0.05)

        retrying = AsyncRetrying(
            stop=stop_after_delay(self.miss_deadline),
            wait=wait_exponential_jitter(initial=0.1, max=5.0, jitter=0.5),
            retry=retry_if_exception_type(RETRIED),
            reraise=True,
        )
        return retrying, stream_timeout

    def delivered(self) -> None:
        """A block arrived from the source: no probe for what gave up before now."""
        self._last_arrival = time.monotonic()

    def gave_up(self, digests: Iterable[str], error: MissDeadline) -> None:
        """A batch ran out of its miss deadline with ``digests`` not delivered."""
        now = time.monotonic()
        for digest in digests:
            self._gave_up[digest] = (now, error)
        while len(self._gave_up) > GAVE_UP_KEPT:  # oldest first
            del self._gave_up[next(iter(self._gave_up))]

    def reader(self, misses: Iterable[str]) -> ReaderWait:
        """The wait of a reader that misses ``misses``, starting now: only a probe when a
        miss of one of them just gave up and nothing arrived since, else the full miss
        deadline."""
        gave_up = next((e for d in misses if (e := self._gave_up_on(d)) is not None), None)
        return ReaderWait(self.miss_deadline, gave_up)

    def _gave_up_on(self, digest: str) -> MissDeadline | None:
        gave_up = self._gave_up.get(digest)
        if gave_up is None:
            return None
        when, error = gave_up
        if (
            time.monotonic() - when < min(GAVE_UP_MEMORY_S, self.miss_deadline)
            and when > self._last_arrival
        ):
            return error
        del self._gave_up[digest]
        return None


class ReaderWait:
    """One reader's wait for the fetches of its misses (:meth:`Deadlines.reader`).

    Args:
        miss_deadline: the reader's own deadline from now, seconds.
        gave_up: the error of a recent give-up among its misses: the wait is then only a
            probe (:data:`PROBE_S`), which raises it.
    """

    def __init__(self, miss_deadline: float, gave_up: MissDeadline | None) -> None:
        self._deadline = time.monotonic() + miss_deadline
        self._gave_up = gave_up
        loop = asyncio.get_running_loop()
        self._probe_end = loop.time() + min(PROBE_S, miss_deadline / 4)

    async def outcome(
        self,
        future: asyncio.Future[bytes | None],
        again: Callable[[], asyncio.Future[bytes | None] | None],
    ) -> bytes | None:
        """The outcome of a fetch the reader waits for (its bytes when streamed through,
        None when cached). A fetch that ran out of time is followed by ``again`` (a fetch
        of the reader's own; None: the block is cached now) while the reader has time.

        Raises:
            MissDeadline: the reader's own deadline passed, or (a probe) the give-up.
        """
        if self._gave_up is not None:  # only a probe: the fetch goes on for later readers
            loop = asyncio.get_running_loop()
            try:
                # shield: a caller giving up must not cancel a fetch others wait on
                return await asyncio.wait_for(
                    asyncio.shield(future), max(self._probe_end - loop.time(), 0)
                )
            except TimeoutError:
                raise self._gave_up from None
        while True:
            try:
                return await asyncio.shield(future)
            except MissDeadline:
                if time.monotonic() > self._deadline - 0.1:
                    raise
                retry = again()
                if retry is None:
                    return None
                future = retry
