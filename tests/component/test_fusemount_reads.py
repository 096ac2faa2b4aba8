"""The mount's read flow and namespace without a kernel: a fake daemon, real block files.

One flow per block (block file, else the daemon, one retry loop), the errno each daemon
failure becomes, a damaged cache disk repaired through the daemon, hit reports in batches,
and listings that never wait on a stalled catalog.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pyfuse3
import pytest
import trio

from fusemount.hits import HitLog
from fusemount.operations import StrataOperations
from fusemount.reader import BlockReader
from spoke.disk.layout import CacheLayout, block_digest
from tests.component.fake_daemon import FakeDaemon

CTX: Any = SimpleNamespace(pid=4242, uid=0, gid=0, umask=0)  # as pyfuse3 passes one
BLOCK = 1000


class FakeRpcError(grpc.RpcError):
    """What a grpc call raises: an RpcError with a status code."""

    def __init__(self, code: grpc.StatusCode) -> None:
        super().__init__(code.name)
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "from the test"


@pytest.fixture
def daemon(tmp_path: Path) -> FakeDaemon:
    blocks = {}
    for i in range(3):
        data = bytes([i]) * BLOCK
        blocks[block_digest(data)] = data
    return FakeDaemon(CacheLayout(tmp_path), blocks)


@pytest.fixture
def ops(daemon: FakeDaemon) -> StrataOperations:
    return StrataOperations(daemon, BlockReader(daemon.layout, daemon))  # type: ignore[arg-type]


async def _open(ops: StrataOperations, version: str = "v1") -> int:
    inode = pyfuse3.ROOT_INODE
    for name in ("ds", version, "dir", "f.bin"):
        inode = (await ops.lookup(inode, name.encode(), CTX)).st_ino
    return int((await ops.open(inode, os.O_RDONLY, CTX)).fh)


def _digest(daemon: FakeDaemon, index: int) -> str:
    return list(daemon.blocks)[index]


async def _expect_errno(code: int, coro: Any) -> None:
    with pytest.raises(pyfuse3.FUSEError) as info:
        await coro
    assert info.value.errno == code


def test_a_hit_is_served_from_the_open_block_file_and_counted_once(
    ops: StrataOperations, daemon: FakeDaemon
) -> None:
    async def go() -> None:
        fh = await _open(ops)
        assert await ops.read(fh, 0, 10) == b"\x00" * 10  # a miss: fetched, file opened
        assert (ops.reader.misses, ops.reader.hits) == (1, 0)
        for _ in range(5):
            assert bytes(await ops.read(fh, 100, 10)) == b"\x00" * 10
        assert (ops.reader.misses, ops.reader.hits) == (1, 5)
        assert daemon.ensured == [_digest(daemon, 0)]
        assert ops.reader.files.verifications == 1

    trio.run(go)


def test_read_cached_serves_only_open_verified_files(tmp_path: Path) -> None:
    layout = CacheLayout(tmp_path)
    data = os.urandom(8192)
    digest = block_digest(data)
    path = layout.block_path(digest)
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    reader = BlockReader(layout, FakeDaemon(layout, {}))  # type: ignore[arg-type]
    files = reader.files
    assert files.read_cached(digest, 0, 10) is None  # never opened: not verified yet
    assert files.read(digest, 0, 10) == data[:10]  # opens and verifies (a worker's job)
    assert files.read_cached(digest, 100, 50) == data[100:150]  # page-cache hot: no thread
    assert files.read_cached(digest, 8000, 500) == data[8000:]  # the block's end
    path.unlink()  # evicted by the daemon
    # until its next identity check the open file still serves the (verified) bytes ...
    assert files.read_cached(digest, 0, 10) == data[:10]
    files.recheck_after = 0.0  # ... and the check finds it evicted: a miss
    assert files.read_cached(digest, 0, 10) is None


def test_a_block_file_deleted_from_the_cache_disk_is_refetched(
    ops: StrataOperations, daemon: FakeDaemon
) -> None:
    digest = _digest(daemon, 1)
    ops.reader.files.recheck_after = 0.0  # every hit checks its file (no window)

    async def go() -> None:
        fh = await _open(ops)
        assert await ops.read(fh, BLOCK, 10) == b"\x01" * 10
        daemon.layout.block_path(digest).unlink()  # gone behind the daemon's back
        assert digest in daemon.resident  # its index still says it is there
        assert await ops.read(fh, BLOCK + 500, 10) == b"\x01" * 10
        # asked once plainly (the daemon said "on disk"), then as suspect: dropped, refetched
        assert daemon.ensured == [digest, digest, digest]
        assert daemon.suspects == [digest]
        assert daemon.layout.block_path(digest).read_bytes() == daemon.blocks[digest]

    trio.run(go)


def test_an_unreadable_block_file_is_a_miss_the_daemon_repairs(
    ops: StrataOperations, daemon: FakeDaemon
) -> None:
    digest = _digest(daemon, 2)
    path = daemon.layout.block_path(digest)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.mkdir()  # opening it fails with EISDIR: unreadable
    daemon.resident.add(digest)

    async def go() -> None:
        fh = await _open(ops)
        assert await ops.read(fh, 2 * BLOCK, 10) == b"\x02" * 10
        assert daemon.suspects == [digest]

    trio.run(go)


def test_a_corrupt_block_file_is_sent_as_suspect(ops: StrataOperations, daemon: FakeDaemon) -> None:
    digest = _digest(daemon, 0)
    path = daemon.layout.block_path(digest)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\xff" * BLOCK)  # wrong bytes under the right name
    daemon.resident.add(digest)

    async def go() -> None:
        fh = await _open(ops)
        assert await ops.read(fh, 0, BLOCK) == b"\x00" * BLOCK  # never the wrong bytes
        assert daemon.suspects == [digest]
        assert daemon.ensured == [digest]

    trio.run(go)


def test_a_daemon_restart_mid_miss_is_retried(ops: StrataOperations, daemon: FakeDaemon) -> None:
    ensure = daemon.ensure_blocks
    failures = [FakeRpcError(grpc.StatusCode.UNAVAILABLE)] * 2

    def restarting(
        blocks: Sequence[tuple[str, int]], suspect: Sequence[str], timeout: float
    ) -> dict[str, bytes]:
        daemon.ensured.append("call")
        if failures:
            raise failures.pop()
        return ensure(blocks, suspect, timeout)

    daemon.ensure_blocks = restarting  # type: ignore[method-assign]

    async def go() -> None:
        fh = await _open(ops)
        assert await ops.read(fh, 0, 10) == b"\x00" * 10
        assert daemon.ensured.count("call") == 3

    trio.run(go)


@pytest.mark.parametrize(
    ("code", "want"),
    [
        (grpc.StatusCode.DEADLINE_EXCEEDED, errno.EIO),
        (grpc.StatusCode.NOT_FOUND, errno.ENOENT),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, errno.EIO),
    ],
)
def test_a_failed_miss_becomes_its_errno(
    ops: StrataOperations, daemon: FakeDaemon, code: grpc.StatusCode, want: int
) -> None:
    def failing(*args: object) -> dict[str, bytes]:
        raise FakeRpcError(code)

    daemon.ensure_blocks = failing  # type: ignore[method-assign]

    async def go() -> None:
        fh = await _open(ops)
        await _expect_errno(want, ops.read(fh, 0, 10))

    trio.run(go)


def test_unavailable_past_the_miss_deadline_is_eio(
    ops: StrataOperations, daemon: FakeDaemon
) -> None:
    daemon.miss_deadline = 0.2
    calls = []

    def down(*args: object) -> dict[str, bytes]:
        calls.append(1)
        raise FakeRpcError(grpc.StatusCode.UNAVAILABLE)

    daemon.ensure_blocks = down  # type: ignore[method-assign]

    async def go() -> None:
        fh = await _open(ops)
        await _expect_errno(errno.EIO, ops.read(fh, 0, 10))
        assert len(calls) >= 2  # retried, then given up

    trio.run(go)


def test_a_block_that_never_becomes_readable_is_eio(
    ops: StrataOperations, daemon: FakeDaemon
) -> None:
    def lying(*args: object) -> dict[str, bytes]:
        daemon.ensured.append("call")
        return {}  # "on disk", but never written

    daemon.ensure_blocks = lying  # type: ignore[method-assign]

    async def go() -> None:
        fh = await _open(ops)
        await _expect_errno(errno.EIO, ops.read(fh, 0, 10))
        assert daemon.ensured.count("call") == 3

    trio.run(go)


def test_streamed_blocks_are_kept_for_the_rest_of_their_reads(
    ops: StrataOperations, daemon: FakeDaemon
) -> None:
    def full_disk(
        blocks: Sequence[tuple[str, int]], suspect: Sequence[str], timeout: float
    ) -> dict[str, bytes]:
        daemon.ensured.extend(d for d, _ in blocks)
        return {d: daemon.blocks[d] for d, _ in blocks}

    daemon.ensure_blocks = full_disk  # type: ignore[method-assign]

    async def go() -> None:
        fh = await _open(ops)
        assert await ops.read(fh, 0, 10) == b"\x00" * 10
        assert await ops.read(fh, 500, 10) == b"\x00" * 10
        assert daemon.ensured == [_digest(daemon, 0)]

    trio.run(go)


def test_hits_go_out_in_one_batch(ops: StrataOperations, daemon: FakeDaemon) -> None:
    async def go() -> None:
        fh = await _open(ops)
        await ops.read(fh, 0, 3 * BLOCK)  # three misses: not hits
        for i in range(10):
            await ops.read(fh, i * 100, 10)
        await ops.reader.flush_hits()
        assert daemon.reports == [[_digest(daemon, 0)] * 10]
        await ops.reader.flush_hits()  # nothing new: no empty report
        assert len(daemon.reports) == 1

    trio.run(go)


def test_a_full_batch_is_reported_before_its_interval(daemon: FakeDaemon) -> None:
    log = HitLog(daemon)  # type: ignore[arg-type]

    async def go() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(log.report_forever, 3600.0)
            await trio.sleep(0)
            for _ in range(1024):
                log.add("d")
            with trio.fail_after(10):  # a hang guard, not a timing assertion
                while not daemon.reports:
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
        assert daemon.reports == [["d"] * 1024]

    trio.run(go)


def test_lookups_never_wait_for_a_stalled_catalog(
    ops: StrataOperations, daemon: FakeDaemon
) -> None:
    list_versions = daemon.list_versions
    stalled = threading.Event()
    release = threading.Event()

    def blackholed(dataset: str) -> Any:
        stalled.set()
        release.wait(30)  # a hub that stopped answering
        return list_versions(dataset)

    async def go() -> None:
        fh = await _open(ops)  # listings loaded while the daemon answers
        assert await ops.read(fh, 0, 10) == b"\x00" * 10
        daemon.list_versions = blackholed  # type: ignore[method-assign]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ops.namespace.refresh)
            await trio.to_thread.run_sync(stalled.wait)  # the refresh is stuck in the daemon
            with trio.fail_after(10):  # a hang guard: the lookups below must not wait
                ds = await ops.lookup(pyfuse3.ROOT_INODE, b"ds", CTX)
                v1 = await ops.lookup(ds.st_ino, b"v1", CTX)
                again = await _open(ops)
                assert await ops.read(again, BLOCK, 10) == b"\x01" * 10
            assert v1.st_ino > ds.st_ino
            release.set()

    trio.run(go)


def test_a_new_version_shows_after_a_background_refresh(
    ops: StrataOperations, daemon: FakeDaemon
) -> None:
    async def go() -> None:
        ds = await ops.lookup(pyfuse3.ROOT_INODE, b"ds", CTX)
        await ops.lookup(ds.st_ino, b"v1", CTX)
        daemon.versions = ["v1", "v2"]
        await _expect_errno(errno.ENOENT, ops.lookup(ds.st_ino, b"v2", CTX))  # stored listing
        await ops.namespace.refresh()
        assert (await ops.lookup(ds.st_ino, b"v2", CTX)).st_ino > 0
        assert await ops.readlink((await ops.lookup(ds.st_ino, b"latest", CTX)).st_ino, CTX) == (
            b"v2"
        )

    trio.run(go)
