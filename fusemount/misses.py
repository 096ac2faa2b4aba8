"""Misses of many readers asked of the daemon together: :class:`MissBatcher`.

Every ``EnsureBlocks`` call costs the mount a thread hop and a gRPC round trip, and the
daemon a call (with the front door's two relay threads) and, alone, a hub stream of its
own: on a shared 2-core machine about 1 ms of CPU in each process, mostly context
switches, so 8 readers of small files missed at about 150 files/s with the hub on
loopback. Small misses that arrive while a shared call is out therefore wait for it to
come back, at most :data:`MISS_GATHER_S`, and go together in one call (which the daemon
fetches as one batch). A miss while no shared call is out leaves at once, so a lone
reader pays nothing, and one on a slow link waits at most the gather time.

What is not shared: a block above :data:`SHARED_BLOCK_BYTES` (its reader should not wait
for others' blocks, nor they for it) and a suspect block (the daemon re-verifies it);
those are asked alone, as before. A shared call that fails is no verdict on every block
in it (one block's NOT_FOUND, the earliest reader's deadline), so each reader of a failed
shared call asks again alone, within its own deadline, and gets its own answer.

Loop-only state (trio), no locks; the calls run in worker threads behind the miss
limiter.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import grpc
import trio

from fusemount.client import DaemonClient

MISS_GATHER_S = 0.005
"""Longest a small miss waits for a shared call that is out to come back before it goes
(with those gathered meanwhile), seconds."""

SHARED_BLOCK_BYTES = 1 << 20
"""Largest block asked for in a shared call (the hub packs blocks up to this size into one
message)."""


@dataclass(eq=False)
class _Miss:
    """One block wanted by one or more readers, until its shared call returns."""

    digest: str
    size: int
    deadline: float  # the earliest of its readers' (monotonic)
    done: trio.Event = field(default_factory=trio.Event)
    uncached: dict[str, bytes] = field(default_factory=dict)
    error: grpc.RpcError | None = None
    shared: bool = False  # its call asked for other blocks too


class MissBatcher:
    """``EnsureBlocks`` for the mount's misses, small ones gathered into shared calls.

    Args:
        client: the daemon connection.
        limiter: the worker threads daemon calls may use.
        gather_s: longest a small miss waits for a shared call out to return (0: never).
    """

    def __init__(
        self,
        client: DaemonClient,
        limiter: trio.CapacityLimiter,
        gather_s: float = MISS_GATHER_S,
    ) -> None:
        self.client = client
        self.gather_s = gather_s
        self.calls = 0  # EnsureBlocks calls made
        self.shared_blocks = 0  # blocks asked for in calls that asked for more than one
        self._limiter = limiter
        self._queue: dict[str, _Miss] = {}  # waiting to be sent
        self._out = 0  # shared calls out
        self._returned = trio.Event()  # set (and replaced) when a shared call returns
        self._leading = False  # a miss is gathering the queue to send it

    async def ensure(
        self, digest: str, size: int, suspect: bool, timeout: float
    ) -> dict[str, bytes]:
        """As :meth:`fusemount.client.DaemonClient.ensure_blocks` for one block.

        Returns:
            The block's bytes by digest if the daemon could not cache it, else nothing.

        Raises:
            grpc.RpcError: this block's call failed (as ``ensure_blocks``).
        """
        if suspect or size > SHARED_BLOCK_BYTES or self.gather_s <= 0:
            return await self._alone(digest, size, suspect, timeout)
        deadline = time.monotonic() + timeout
        miss = self._queue.get(digest)
        if miss is None:
            miss = self._queue[digest] = _Miss(digest, size, deadline)
        else:
            miss.deadline = min(miss.deadline, deadline)
        if not self._leading:
            await self._lead()
        await miss.done.wait()
        if miss.error is None:
            return miss.uncached
        remaining = deadline - time.monotonic()
        if not miss.shared or remaining <= 0:
            raise miss.error
        return await self._alone(digest, size, False, remaining)

    async def _lead(self) -> None:
        """Gather the queue (while a shared call is out, until it returns or the gather
        time passes) and send it as one call."""
        self._leading = True
        try:
            # shielded and bounded: a cancelled leader must not strand the queue
            with trio.CancelScope(shield=True), trio.move_on_after(self.gather_s):
                if self._out:
                    await self._returned.wait()
        finally:
            self._leading = False
        batch, self._queue = list(self._queue.values()), {}
        if not batch:
            return
        shared = len(batch) > 1
        now = time.monotonic()
        timeout = max(min(m.deadline for m in batch) - now, 0.001)
        self._out += 1
        self.calls += 1
        if shared:
            self.shared_blocks += len(batch)
        try:
            uncached = await trio.to_thread.run_sync(
                self.client.ensure_blocks,
                [(m.digest, m.size) for m in batch],
                [],
                timeout,
                limiter=self._limiter,
            )
        except grpc.RpcError as err:
            for m in batch:
                m.error, m.shared = err, shared
        else:
            for m in batch:
                if m.digest in uncached:
                    m.uncached = {m.digest: uncached[m.digest]}
        finally:
            self._out -= 1
            for m in batch:
                m.done.set()
            self._returned.set()
            self._returned = trio.Event()

    async def _alone(
        self, digest: str, size: int, suspect: bool, timeout: float
    ) -> dict[str, bytes]:
        self.calls += 1
        return await trio.to_thread.run_sync(
            self.client.ensure_blocks,
            [(digest, size)],
            [digest] if suspect else [],
            timeout,
            limiter=self._limiter,
        )
