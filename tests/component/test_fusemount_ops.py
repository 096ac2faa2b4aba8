"""The mount's Operations called directly (no kernel): tree, reads, errors, the boundary."""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyfuse3
import pytest
import trio

from fusemount import boundary, readerrors
from fusemount import openers as openers_module
from fusemount.hits import PROMPT_INTERVAL
from fusemount.openers import Opener
from fusemount.operations import StrataOperations
from fusemount.reader import BlockReader
from fusemount.source import BlockUnavailableError
from spoke.disk.layout import CacheLayout, block_digest
from tests.component.fake_daemon import FakeDaemon
from tests.support import eventually_async


@pytest.fixture
def ops(tmp_path: Path) -> StrataOperations:
    blocks = {}
    for i in range(3):
        data = bytes([i]) * 1000
        blocks[block_digest(data)] = data
    layout = CacheLayout(tmp_path)
    daemon = FakeDaemon(layout, blocks)
    return StrataOperations(daemon, BlockReader(layout, daemon))  # type: ignore[arg-type]


CTX: Any = SimpleNamespace(pid=4242, uid=0, gid=0, umask=0)  # as pyfuse3 passes one


async def _walk(ops: StrataOperations, *names: str) -> pyfuse3.EntryAttributes:
    inode = pyfuse3.ROOT_INODE
    attr = await ops.getattr(inode, CTX)
    for name in names:
        attr = await ops.lookup(inode, name.encode(), CTX)
        inode = attr.st_ino
    return attr


def test_tree_and_reads(ops: StrataOperations) -> None:
    async def go() -> None:
        tag = await _walk(ops, "ds", "latest")
        assert stat.S_ISLNK(tag.st_mode)
        assert await ops.readlink(tag.st_ino, CTX) == b"v1"
        attr = await _walk(ops, "ds", "v1", "dir", "f.bin")
        assert attr.st_size == 3000 and stat.S_IMODE(attr.st_mode) == 0o644
        fi = await ops.open(attr.st_ino, os.O_RDONLY, CTX)
        assert fi.keep_cache
        data = await ops.read(fi.fh, 990, 1020)  # spans blocks 0, 1, 2
        assert data == b"\x00" * 10 + b"\x01" * 1000 + b"\x02" * 10
        assert ops.reader.misses == 3
        assert await ops.read(fi.fh, 990, 20) == b"\x00" * 10 + b"\x01" * 10
        assert ops.reader.hits == 2
        assert await ops.read(fi.fh, 3000, 10) == b""
        await ops.release(fi.fh)
        # same inode every time
        assert (await _walk(ops, "ds", "v1", "dir", "f.bin")).st_ino == attr.st_ino

    trio.run(go)


def test_errnos(ops: StrataOperations) -> None:
    async def expect(code: int, coro: Any) -> None:
        with pytest.raises(pyfuse3.FUSEError) as info:
            await coro
        assert info.value.errno == code

    async def go() -> None:
        attr = await _walk(ops, "ds", "v1", "dir", "f.bin")
        await expect(errno.EROFS, ops.open(attr.st_ino, os.O_WRONLY, CTX))
        await expect(errno.EROFS, ops.open(attr.st_ino, os.O_RDWR | os.O_TRUNC, CTX))
        await expect(errno.EROFS, ops.mkdir(1, b"x", 0o755, CTX))
        await expect(errno.ENOENT, ops.lookup(1, b"nope", CTX))
        await expect(errno.ENOENT, ops.getattr(999_999, CTX))
        await expect(errno.EBADF, ops.read(12345, 0, 10))
        neg = await ops.lookup(attr.st_ino - 1, b"missing", CTX)  # inside a snapshot: cached
        assert neg.st_ino == 0

    trio.run(go)


def test_error_boundary_turns_surprises_into_eio(ops: StrataOperations) -> None:
    assert isinstance(ops.client, FakeDaemon)
    ops.client.fail_catalog = True
    before = boundary.UNEXPECTED_ERRORS["lookup"]

    async def go() -> None:
        ds = await ops.lookup(1, b"ds", CTX)
        with pytest.raises(pyfuse3.FUSEError) as info:
            await ops.lookup(ds.st_ino, b"v1", CTX)
        assert info.value.errno == errno.EIO

    trio.run(go)
    assert boundary.UNEXPECTED_ERRORS["lookup"] == before + 1


def test_a_block_evicted_before_its_read_is_fetched_again(ops: StrataOperations) -> None:
    daemon = ops.client
    assert isinstance(daemon, FakeDaemon)
    ensure = daemon.ensure_blocks
    evict_next = [True]

    def evicting(
        blocks: Sequence[tuple[str, int]], suspect: Sequence[str], timeout: float
    ) -> dict[str, bytes]:
        out = ensure(blocks, suspect, timeout)
        if evict_next[0]:  # evicted at once, before the mount could read it
            evict_next[0] = False
            for digest, _ in blocks:
                daemon.layout.block_path(digest).unlink()
        return out

    daemon.ensure_blocks = evicting  # type: ignore[method-assign]

    async def go() -> None:
        attr = await _walk(ops, "ds", "v1", "dir", "f.bin")
        fi = await ops.open(attr.st_ino, os.O_RDONLY, CTX)
        assert await ops.read(fi.fh, 0, 10) == b"\x00" * 10  # not EIO
        first = daemon.ensured[0]
        assert daemon.ensured == [first, first]

    trio.run(go)


def test_hits_are_reported_at_once_while_the_daemon_asks_for_it(ops: StrataOperations) -> None:
    daemon = ops.client
    assert isinstance(daemon, FakeDaemon)
    reports: list[list[str]] = []
    daemon.record_access = lambda digests, *_: reports.append(list(digests))  # type: ignore[method-assign]

    async def go() -> None:
        attr = await _walk(ops, "ds", "v1", "dir", "f.bin")
        fi = await ops.open(attr.st_ino, os.O_RDONLY, CTX)
        await ops.read(fi.fh, 0, 3000)  # three misses: the blocks are cached now
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ops.reader.flush_hits_forever, 10.0)  # a long interval
            await ops.read(fi.fh, 0, 10)  # a hit: batched, not reported yet
            # Nothing to await: the reporter sleeps its 10 s interval unless add() sets its
            # Event (a full batch or prompt), and a woken one reports within a loop turn;
            # 0.05 s is many turns (the prompt case below shows one suffices).
            await trio.sleep(0.05)
            assert reports == []
            daemon.prompt = True  # e.g. an EnsureBlocks answer said a hint is installed
            await ops.read(fi.fh, 1000, 10)  # the next hit goes out at once
            await eventually_async(lambda: reports, "the prompt report", 5, sleep=trio.sleep)
            assert len(reports) == 1 and len(reports[0]) == 2
            nursery.cancel_scope.cancel()

    trio.run(go)


@pytest.mark.timing
def test_prompt_reports_go_out_at_most_once_per_interval(ops: StrataOperations) -> None:
    daemon = ops.client
    assert isinstance(daemon, FakeDaemon)
    reports: list[tuple[float, list[str]]] = []

    async def go() -> None:
        daemon.record_access = lambda digests, *_: reports.append(  # type: ignore[method-assign]
            (time.monotonic(), list(digests))
        )
        attr = await _walk(ops, "ds", "v1", "dir", "f.bin")
        fi = await ops.open(attr.st_ino, os.O_RDONLY, CTX)
        await ops.read(fi.fh, 0, 3000)  # the blocks are cached now
        daemon.prompt = True
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ops.reader.flush_hits_forever, 10.0)
            for _ in range(200):  # a burst of hits, as a trainer's FUSE reads make
                await ops.read(fi.fh, 0, 10)
                await trio.sleep(0.0005)  # the workload: hits spread over time
            await eventually_async(
                lambda: sum(len(digests) for _, digests in reports) >= 200,
                "the burst's last prompt report",
                5,
                sleep=trio.sleep,
            )
            nursery.cancel_scope.cancel()

    trio.run(go)
    assert sum(len(digests) for _, digests in reports) == 200  # every hit reported
    assert len(reports) >= 2
    # not one call per hit: at most one report per interval over the burst (counted from
    # when the fake daemon ran each call, whose worker thread may start a call late and
    # so make one gap shorter; on CI one came 6.4 ms after the one before it)
    span = reports[-1][0] - reports[0][0]
    assert len(reports) - 1 <= span / (PROMPT_INTERVAL * 0.9) + 1, (len(reports), span)


def test_a_read_answered_eio_reaches_the_daemon_with_the_next_hit_report(
    ops: StrataOperations,
) -> None:
    """A read the boundary answers with EIO is counted and carried by the next hit report
    (strata_spoke_read_errors_total); a lookup's EIO is not a failed read."""
    daemon = ops.client
    assert isinstance(daemon, FakeDaemon)
    readerrors.take_read_errors()  # what earlier tests left

    async def failing(*args: object) -> bytes:
        raise BlockUnavailableError(errno.EIO, "the hub did not deliver")

    async def go() -> None:
        node = await _walk(ops, "ds", "v1", "dir", "f.bin")
        fi = await ops.open(node.st_ino, os.O_RDONLY, CTX)
        ops.reader.read = failing  # type: ignore[method-assign]
        for _ in range(2):
            with pytest.raises(pyfuse3.FUSEError) as info:
                await ops.read(fi.fh, 0, 10)
            assert info.value.errno == errno.EIO
        daemon.fail_catalog = True
        with pytest.raises(pyfuse3.FUSEError):
            await ops.lookup(1, b"other", CTX)
        await ops.reader.hit_log.report()

    trio.run(go)
    assert daemon.read_errors == 2
    assert readerrors.take_read_errors() == 0  # told once


def test_opens_of_one_inode_beyond_its_serials_share_a_handle_and_never_fail(
    ops: StrataOperations, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A handle carries its inode and 15 bits of serial; past those, opens share a handle
    (issue 39's seventeenth probe: 32,768 opens by one user made every other open of the
    file ENFILE, root's included). Shrunk here to 8 serials."""
    from fusemount import handles as handles_module

    monkeypatch.setattr(handles_module, "_FH_SERIALS", 8)

    async def go() -> None:
        attr = await _walk(ops, "ds", "v1", "dir", "f.bin")
        handles = [(await ops.open(attr.st_ino, os.O_RDONLY, CTX)).fh for _ in range(20)]
        assert len(set(handles)) == 8  # every serial, then shared
        for fh in handles[:-1]:  # every open but the last released: its handle still reads
            await ops.release(fh)
        assert await ops.read(handles[-1], 0, 4) == b"\x00" * 4
        await ops.release(handles[-1])
        assert handles[-1] not in ops.handles and ops.handles.held(_opener(ops, CTX)) == 0

    trio.run(go)


def _opener(ops: StrataOperations, ctx: Any) -> Opener:
    return ops.openers.of(ctx.pid, ctx.uid)


@pytest.fixture
def cgroups(monkeypatch: pytest.MonkeyPatch) -> dict[int, str]:
    """Each test pid's cgroup, as ``/proc/PID/cgroup`` would say (set by the test)."""
    table: dict[int, str] = {}
    monkeypatch.setattr(openers_module, "cgroup_of", lambda pid: table.get(pid, ""))
    return table


def test_one_pod_setting_many_uids_is_one_opener(
    ops: StrataOperations, cgroups: dict[int, str]
) -> None:
    """The twentieth probe: a root pod setting a new fsuid for each open made each uid an
    opener, and 2,000 of them cut every other pod's fair share to 522 handles. A pod's
    containers, whatever their uids, are one opener."""
    ops.handles.per_opener = 3
    pod = "/kubepods/besteffort/pod1234abcd-5678-90ab-cdef-1234567890ab"
    cgroups.update({101: f"{pod}/c1", 102: f"{pod}/c2"})
    users = [SimpleNamespace(pid=101 + i % 2, uid=70000 + i, gid=0, umask=0) for i in range(4)]

    async def go() -> None:
        attr = await _walk(ops, "ds", "v1", "dir", "f.bin")
        held = [(await ops.open(attr.st_ino, os.O_RDONLY, u)).fh for u in users[:3]]
        with pytest.raises(pyfuse3.FUSEError) as info:
            await ops.open(attr.st_ino, os.O_RDONLY, users[3])
        assert info.value.errno == errno.EMFILE
        assert len({_opener(ops, u) for u in users}) == 1
        for fh in held:
            await ops.release(fh)

    trio.run(go)


def test_pods_of_one_uid_hold_their_handles_apart(
    ops: StrataOperations, cgroups: dict[int, str]
) -> None:
    """Issue 39's nineteenth probe: the quota was per uid, and pods share uids (root,
    1000, 65532), so one pod's 262,144 opens made every open of another pod of that uid
    fail EMFILE. An opener is a uid in a cgroup (a container's)."""
    ops.handles.per_opener = 3
    pod_a = SimpleNamespace(pid=101, uid=1000, gid=1000, umask=0)
    pod_b = SimpleNamespace(pid=202, uid=1000, gid=1000, umask=0)
    cgroups.update({101: "/kubepods/pod-a/c1", 202: "/kubepods/pod-b/c1"})  # (services)

    async def go() -> None:
        attr = await _walk(ops, "ds", "v1", "dir", "f.bin")
        held = [(await ops.open(attr.st_ino, os.O_RDONLY, pod_a)).fh for _ in range(3)]
        with pytest.raises(pyfuse3.FUSEError) as info:
            await ops.open(attr.st_ino, os.O_RDONLY, pod_a)
        assert info.value.errno == errno.EMFILE
        held.append((await ops.open(attr.st_ino, os.O_RDONLY, pod_b)).fh)  # same uid
        assert ops.handles.held(_opener(ops, pod_a)) == 3
        assert ops.handles.held(_opener(ops, pod_b)) == 1
        for fh in held:
            await ops.release(fh)

    trio.run(go)


def test_past_the_nodes_handles_only_openers_under_the_floor_may_open(
    ops: StrataOperations, cgroups: dict[int, str]
) -> None:
    """The nineteenth probe: each uid's opens added 117 MiB to the mount, with no bound
    over all of them; the twentieth: a share of the rest for each new opener added up
    to 1.9 M handles. Past the node's handles (6 here), an opener holding the floor (2
    here) is refused; one under it still opens."""
    ops.handles.per_opener, ops.handles.node, ops.handles.floor = 100, 6, 2
    big = SimpleNamespace(pid=101, uid=1000, gid=1000, umask=0)
    small = SimpleNamespace(pid=202, uid=1001, gid=1001, umask=0)

    async def go() -> None:
        attr = await _walk(ops, "ds", "v1", "dir", "f.bin")
        held = [(await ops.open(attr.st_ino, os.O_RDONLY, big)).fh for _ in range(6)]
        with pytest.raises(pyfuse3.FUSEError) as info:  # the node's 6 held, 6 >= 2
            await ops.open(attr.st_ino, os.O_RDONLY, big)
        assert info.value.errno == errno.EMFILE
        held += [(await ops.open(attr.st_ino, os.O_RDONLY, small)).fh for _ in range(2)]
        with pytest.raises(pyfuse3.FUSEError):  # its floor
            await ops.open(attr.st_ino, os.O_RDONLY, small)
        for fh in held:
            await ops.release(fh)
        assert ops.handles.held(_opener(ops, big)) == ops.handles.held(_opener(ops, small)) == 0
        await ops.release((await ops.open(attr.st_ino, os.O_RDONLY, big)).fh)  # room again

    trio.run(go)


def test_a_shared_handle_is_counted_for_its_maker_alone(
    ops: StrataOperations, monkeypatch: pytest.MonkeyPatch, cgroups: dict[int, str]
) -> None:
    """A release does not say who closes: counting each sharer, the nineteenth probe's
    F5 moved counts between uids (V's opens and closes of a handle A shared left V at
    its cap). A shared open adds no state and counts for nobody."""
    from fusemount import handles as handles_module

    monkeypatch.setattr(handles_module, "_FH_SERIALS", 2)
    maker = SimpleNamespace(pid=101, uid=1000, gid=1000, umask=0)
    sharer = SimpleNamespace(pid=202, uid=1001, gid=1001, umask=0)

    async def go() -> None:
        attr = await _walk(ops, "ds", "v1", "dir", "f.bin")
        mine = [(await ops.open(attr.st_ino, os.O_RDONLY, maker)).fh for _ in range(2)]
        for _ in range(10):  # every serial taken: the sharer's opens share, and close
            fh = (await ops.open(attr.st_ino, os.O_RDONLY, sharer)).fh
            assert fh in mine and ops.handles.held(_opener(ops, sharer)) == 0
            await ops.release(fh)
        assert ops.handles.held(_opener(ops, maker)) == 2
        for fh in mine:
            await ops.release(fh)
        assert ops.handles.held(_opener(ops, maker)) == 0

    trio.run(go)


def test_a_user_holds_at_most_its_handles_and_only_its_own_opens_fail(
    ops: StrataOperations, cgroups: dict[int, str]
) -> None:
    """Issue 39's eighteenth probe: one uid's 114,000 opens of distinct files took the
    mount from 64 to 183 MiB, with no bound. Past its handles, that opener's opens fail
    EMFILE; another's do not (here no cgroup is known: the opener is the uid)."""
    ops.handles.per_opener = 3
    user = SimpleNamespace(pid=77, uid=64101, gid=64101, umask=0)

    async def go() -> None:
        attr = await _walk(ops, "ds", "v1", "dir", "f.bin")
        held = [(await ops.open(attr.st_ino, os.O_RDONLY, user)).fh for _ in range(3)]  # type: ignore[arg-type]
        with pytest.raises(pyfuse3.FUSEError) as info:
            await ops.open(attr.st_ino, os.O_RDONLY, user)  # type: ignore[arg-type]
        assert info.value.errno == errno.EMFILE
        other = await ops.open(attr.st_ino, os.O_RDONLY, CTX)  # root's: unaffected
        await ops.release(held.pop())
        held.append((await ops.open(attr.st_ino, os.O_RDONLY, user)).fh)  # type: ignore[arg-type]
        assert ops.handles.held(_opener(ops, user)) == 3
        assert ops.handles.held(_opener(ops, CTX)) == 1
        for fh in [*held, other.fh]:
            await ops.release(fh)
        assert ops.handles.held(_opener(ops, user)) == ops.handles.held(_opener(ops, CTX)) == 0

    trio.run(go)
