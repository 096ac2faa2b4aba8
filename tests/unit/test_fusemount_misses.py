"""Small misses of concurrent readers share EnsureBlocks calls (fusemount/misses.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import grpc
import pytest
import trio

from fusemount.misses import SHARED_BLOCK_BYTES, MissBatcher


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        super().__init__()
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._code.name


class FakeDaemon:
    """``ensure_blocks`` that takes ``delay`` seconds, records every call, fails a call
    naming a digest of ``missing`` with NOT_FOUND and returns the bytes of ``streamed``."""

    def __init__(self, delay: float = 0.05) -> None:
        self.delay = delay
        self.calls: list[tuple[list[str], list[str]]] = []
        self.missing: set[str] = set()
        self.streamed: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def ensure_blocks(
        self, blocks: Sequence[tuple[str, int]], suspect: Sequence[str], timeout: float
    ) -> dict[str, bytes]:
        digests = [d for d, _ in blocks]
        with self._lock:
            self.calls.append((digests, list(suspect)))
        time.sleep(self.delay)
        if self.missing & set(digests):
            raise FakeRpcError(grpc.StatusCode.NOT_FOUND)
        return {d: self.streamed[d] for d in digests if d in self.streamed}


def _digest(i: int) -> str:
    return f"{i:032x}"


def _batcher(daemon: FakeDaemon, gather_s: float = 5.0) -> MissBatcher:
    # a long gather: misses that share a call waited for the call out, not for the timer
    return MissBatcher(daemon, trio.CapacityLimiter(64), gather_s=gather_s)  # type: ignore[arg-type]


def test_misses_while_a_call_is_out_share_the_next_call() -> None:
    daemon = FakeDaemon()
    batcher = _batcher(daemon)
    first_call_after: list[float] = []

    async def go() -> None:
        async def first() -> None:
            started = trio.current_time()
            await batcher.ensure(_digest(0), 4096, False, 10)
            first_call_after.append(trio.current_time() - started)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            await trio.sleep(0.01)  # the lone miss's call is out
            for i in range(1, 7):
                nursery.start_soon(batcher.ensure, _digest(i), 4096, False, 10)

    trio.run(go)
    # (trio starts tasks in no set order)
    assert [sorted(digests) for digests, _ in daemon.calls] == [
        [_digest(0)],
        [_digest(i) for i in range(1, 7)],
    ]
    assert first_call_after[0] < 2.0  # a lone miss does not wait the 5 s gather
    assert batcher.calls == 2
    assert batcher.shared_blocks == 6


def test_large_and_suspect_misses_are_asked_alone() -> None:
    daemon = FakeDaemon()
    batcher = _batcher(daemon)

    async def go() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(batcher.ensure, _digest(0), 4096, False, 10)
            await trio.sleep(0.01)
            nursery.start_soon(batcher.ensure, _digest(1), SHARED_BLOCK_BYTES + 1, False, 10)
            nursery.start_soon(batcher.ensure, _digest(2), 4096, True, 10)
            nursery.start_soon(batcher.ensure, _digest(3), 4096, False, 10)
            nursery.start_soon(batcher.ensure, _digest(4), 4096, False, 10)

    trio.run(go)
    calls = sorted((sorted(digests), suspect) for digests, suspect in daemon.calls)
    assert ([_digest(1)], []) in calls
    assert ([_digest(2)], [_digest(2)]) in calls  # the daemon re-verifies it
    assert ([_digest(3), _digest(4)], []) in calls
    assert len(calls) == 4


def test_a_failed_shared_call_is_asked_again_alone_by_each_reader() -> None:
    daemon = FakeDaemon(delay=0.02)
    daemon.missing = {_digest(2)}
    daemon.streamed = {_digest(3): b"inline"}
    batcher = _batcher(daemon)
    results: dict[str, object] = {}

    async def ask(i: int) -> None:
        try:
            results[_digest(i)] = await batcher.ensure(_digest(i), 4096, False, 10)
        except grpc.RpcError as err:
            results[_digest(i)] = err.code()

    async def go() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, 0)
            await trio.sleep(0.005)
            for i in (1, 2, 3):
                nursery.start_soon(ask, i)

    trio.run(go)
    assert results == {
        _digest(0): {},
        _digest(1): {},
        _digest(2): grpc.StatusCode.NOT_FOUND,  # only the reader of the missing block
        _digest(3): {_digest(3): b"inline"},  # its own bytes, asked again alone
    }
    calls = [(sorted(digests), suspect) for digests, suspect in daemon.calls]
    assert ([_digest(1), _digest(2), _digest(3)], []) in calls
    for i in (1, 2, 3):
        assert ([_digest(i)], []) in calls
    assert len(calls) == 5


def test_a_lone_miss_that_fails_gets_its_own_error_at_once() -> None:
    daemon = FakeDaemon(delay=0.0)
    daemon.missing = {_digest(5)}
    batcher = _batcher(daemon)

    async def go() -> None:
        with pytest.raises(grpc.RpcError) as caught:
            await batcher.ensure(_digest(5), 4096, False, 10)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND

    trio.run(go)
    assert daemon.calls == [([_digest(5)], [])]  # asked once: nothing to ask again alone
