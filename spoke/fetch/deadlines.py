"""Every deadline a fetch has, in one place (:class:`Deadlines`, owned by the fetcher).

* **A batch** keeps retrying, with exponential backoff and jitter (tenacity), until the
  miss deadline and no later: a backoff never sleeps past it (the last attempt gets what
  is left), and each attempt is one stream whose own deadline is the stream timeout or
  what is left of the miss deadline, whichever is sooner (:meth:`Deadlines.attempts`).
* **A reader** waits at most its own miss deadline, from when it asked
  (:class:`ReaderWait`): a fetch it joined that started earlier and ran out of time is
  followed by one of its own while it still has time, waited for only until the reader's
  own deadline: then the reader gives up, as a batch does.
* **A probe.** A miss that gave up at its deadline (a batch's or a reader's) is remembered
  for :data:`GAVE_UP_MEMORY_S`, while nothing has arrived from the source since; a new
  miss of that block then waits only :data:`PROBE_S` (at most a tenth of the miss
  deadline), and its fetch goes on with the full deadline for later readers. So the
  kernel's next request after a failed one (its retry of the failed page) costs a probe,
  not a second deadline: a read the source cannot serve fails after one miss deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
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
"""Longest wait of such a probe (at most a tenth of the miss deadline, so a read whose
first request failed ends within about one deadline): its fetch goes on with the full
deadline for later readers, and a hub that came back answers it in time."""

PROBE_SHARE = 0.1
"""A probe's longest wait as a share of the miss deadline (below :data:`PROBE_S`)."""

LAST_ATTEMPT_S = 0.1
"""The shortest attempt a batch starts: its backoff sleeps at most until this much before
the miss deadline, and a batch with less time left gives up."""

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
        :data:`RETRIED` error at the miss deadline: a backoff never sleeps past it), and
        the deadline of the next stream, seconds (no attempt outlives the miss deadline: a
        silent link)."""
        deadline = time.monotonic() + self.miss_deadline
        backoff = wait_exponential_jitter(initial=0.1, max=5.0, jitter=0.5)

        def stream_timeout() -> float:
            return max(min(self.stream_timeout, deadline - time.monotonic()), 0.05)

        def wait(state: RetryCallState) -> float:  # the last attempt gets what is left
            return max(0.0, min(backoff(state), deadline - LAST_ATTEMPT_S - time.monotonic()))

        def stop(state: RetryCallState) -> bool:
            return deadline - time.monotonic() < LAST_ATTEMPT_S

        retrying = AsyncRetrying(
            stop=stop,
            wait=wait,
            retry=retry_if_exception_type(RETRIED),
            reraise=True,
        )
        return retrying, stream_timeout

    def delivered(self) -> None:
        """A block arrived from the source: no probe for what gave up before now."""
        self._last_arrival = time.monotonic()

    def gave_up(self, digests: Iterable[str], error: MissDeadline) -> None:
        """A batch, or a reader, ran out of its miss deadline with ``digests`` not
        delivered."""
        now = time.monotonic()
        for digest in digests:
            self._gave_up[digest] = (now, error)
        while len(self._gave_up) > GAVE_UP_KEPT:  # oldest first
            del self._gave_up[next(iter(self._gave_up))]

    def reader(self, misses: Sequence[str]) -> ReaderWait:
        """The wait of a reader that misses ``misses``, starting now: only a probe when a
        miss of one of them just gave up and nothing arrived since, else the full miss
        deadline."""
        gave_up = next((e for d in misses if (e := self._gave_up_on(d)) is not None), None)
        return ReaderWait(self, misses, gave_up)

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
        deadlines: whose miss deadline the reader has, from now (seconds), and where a
            wait that runs out of it is told (:meth:`Deadlines.gave_up`).
        misses: the digests the reader waits for, in the order it waits for them.
        gave_up: the error of a recent give-up among its misses: the wait is then only a
            probe (:data:`PROBE_S`), which raises it.
    """

    def __init__(
        self, deadlines: Deadlines, misses: Sequence[str], gave_up: MissDeadline | None
    ) -> None:
        miss_deadline = deadlines.miss_deadline
        self._deadlines = deadlines
        self._misses = list(misses)
        self._deadline = time.monotonic() + miss_deadline
        self._gave_up = gave_up
        loop = asyncio.get_running_loop()
        self._probe_end = loop.time() + min(PROBE_S, miss_deadline * PROBE_SHARE)

    async def outcome(
        self,
        digest: str,
        future: asyncio.Future[bytes | None],
        again: Callable[[], asyncio.Future[bytes | None] | None],
    ) -> bytes | None:
        """The outcome of the fetch of ``digest`` the reader waits for (its bytes when
        streamed through, None when cached). A fetch that ran out of time is followed by
        ``again`` (a fetch of the reader's own; None: the block is cached now) while the
        reader has time, and that one is waited for only until the reader's deadline (it
        goes on for others). The first fetch is waited for until it ends: its batch has a
        deadline of its own once it leaves the queue.

        Raises:
            MissDeadline: the reader's own deadline passed (then ``digest`` and the misses
                after it gave up, for the probe), or (a probe) the give-up.
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
        timeout: float | None = None  # the first fetch: its batch has its own deadline
        while True:
            try:
                return await asyncio.wait_for(asyncio.shield(future), timeout)
            except TimeoutError:  # a fetch of its own, past the reader's deadline
                error = MissDeadline(
                    f"block {digest} did not arrive within the miss deadline "
                    f"({self._deadlines.miss_deadline:g} s)"
                )
                at = self._misses.index(digest) if digest in self._misses else len(self._misses)
                self._deadlines.gave_up([digest, *self._misses[at + 1 :]], error)
                raise error from None
            except MissDeadline:
                if time.monotonic() > self._deadline - 0.1:
                    raise
                retry = again()
                if retry is None:
                    return None
                future = retry
                timeout = max(self._deadline - time.monotonic(), 0)
