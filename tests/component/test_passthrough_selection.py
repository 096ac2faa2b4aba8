"""Which opens go FUSE passthrough, without a kernel: the kernel calls are faked."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from fusemount.backings import ACTIVE_BACKINGS, IDLE_BACKINGS, RECHECK_S
from fusemount.cli import active_backings, idle_backings
from fusemount.passthrough import Passthrough
from fusemount.passthroughcheck import filesystem_type, has_cap_sys_admin, unavailable_reason
from fusemount.tree import Node, Role

BLOCK = 65_536


def _file(inode: int, *sizes: int, snapshot: str = "s1", size: int | None = None) -> Node:
    blocks = tuple((f"d{inode}-{i}", s) for i, s in enumerate(sizes))
    total = sum(sizes) if size is None else size
    return Node(
        inode, Role.ENTRY, stat.S_IFREG | 0o444, size=total, blocks=blocks, snapshot_id=snapshot
    )


class FakeKernel:
    def __init__(self, fail: int | None = None) -> None:
        self.next_id = 1
        self.open_ids: set[int] = set()
        self.fail = fail

    def open(self, fd: int) -> int:
        os.fstat(fd)  # a valid descriptor is handed over
        if self.fail is not None:
            raise OSError(self.fail, os.strerror(self.fail))
        backing_id, self.next_id = self.next_id, self.next_id + 1
        self.open_ids.add(backing_id)
        return backing_id

    def close(self, backing_id: int) -> None:
        self.open_ids.remove(backing_id)


def _fd(tmp_path: Path, name: str = "block", data: bytes = b"x" * 100) -> int:
    path = tmp_path / name
    path.write_bytes(data)
    return os.open(path, os.O_RDONLY)


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError as err:
        return err.errno == errno.EBADF
    return False


def test_only_whole_files_of_exactly_one_block_are_candidates() -> None:
    pt = Passthrough(open_backing=FakeKernel().open, close_backing=FakeKernel().close)
    assert pt.candidate(2, _file(2, 100)) == "d2-0"
    assert pt.candidate(3, _file(3, BLOCK)) == "d3-0"
    assert pt.candidate(4, _file(4, BLOCK, 1)) is None  # two blocks: pyfuse3 path
    assert pt.candidate(5, _file(5)) is None  # empty: no block file
    assert pt.candidate(6, _file(6, 100, size=150)) is None  # block shorter than the file
    off = Passthrough("--passthrough off")
    assert not off.enabled and off.candidate(2, _file(2, 100)) is None


def test_handles_of_one_inode_share_one_backing_id_closed_with_the_last(tmp_path: Path) -> None:
    kernel = FakeKernel()
    pt = Passthrough(open_backing=kernel.open, close_backing=kernel.close, idle_max=0)
    node = _file(2, 100)
    fd = _fd(tmp_path)
    assert pt.shared(2) is None
    first = pt.attach(2, node, "d2-0", fd)
    assert first == 1 and kernel.open_ids == {1} and not _closed(fd)
    assert pt.shared(2) == 1  # a second open of the same inode
    second_fd = _fd(tmp_path, "again")
    assert pt.attach(2, node, "d2-0", second_fd) == 1  # raced in: shares, its fd closed
    assert _closed(second_fd)
    assert pt.opens == 3 and pt.backing_ids == 1
    pt.released(2, passthrough=True)
    pt.released(2, passthrough=True)
    assert kernel.open_ids == {1}
    pt.released(2, passthrough=True)
    assert kernel.open_ids == set() and pt.backing_ids == 0 and _closed(fd)


def test_an_inode_open_on_the_pyfuse3_path_is_not_passed_through_until_released(
    tmp_path: Path,
) -> None:
    kernel = FakeKernel()
    pt = Passthrough(open_backing=kernel.open, close_backing=kernel.close)
    node = _file(2, 100)
    pt.opened_cached(2)
    pt.opened_cached(2)
    assert pt.candidate(2, node) is None  # mixing the modes fails opens (ETXTBSY)
    fd = _fd(tmp_path)
    assert pt.attach(2, node, "d2-0", fd) is None and _closed(fd)  # decided while verifying
    pt.released(2, passthrough=False)
    assert pt.candidate(2, node) is None
    pt.released(2, passthrough=False)
    assert pt.candidate(2, node) == "d2-0"
    assert pt.candidate(3, _file(3, 100)) == "d3-0"  # other inodes were never affected
    assert kernel.open_ids == set()


def test_a_kernel_refusal_turns_passthrough_off_with_the_reason(tmp_path: Path) -> None:
    pt = Passthrough(open_backing=FakeKernel(errno.EPERM).open, close_backing=lambda i: None)
    fd = _fd(tmp_path)
    assert pt.attach(2, _file(2, 100), "d2-0", fd) is None and _closed(fd)
    assert not pt.enabled
    assert pt.reason == "the kernel refused a backing file: Operation not permitted"
    assert pt.candidate(3, _file(3, 100)) is None
    busy = Passthrough(open_backing=FakeKernel(errno.EBUSY).open, close_backing=lambda i: None)
    assert busy.attach(2, _file(2, 100), "d2-0", _fd(tmp_path, "b")) is None
    assert busy.enabled  # one file's refusal: that open takes the pyfuse3 path


def test_init_says_whether_the_kernel_offered_it() -> None:
    pt = Passthrough()
    pt.negotiated(offered=False, requested=False)
    assert not pt.enabled and "kernel did not offer" in pt.reason
    pt = Passthrough()
    pt.negotiated(offered=True, requested=True)
    assert pt.enabled and pt.reason == ""
    off = Passthrough("--passthrough off")
    off.negotiated(offered=True, requested=False)
    assert not off.enabled and off.reason == "--passthrough off"


def test_unavailable_reason_names_each_missing_condition(tmp_path: Path) -> None:
    def check(**kw: object) -> str:
        args: dict[str, object] = {
            "library": lambda: True,
            "privileged": lambda: True,
            "fstype": lambda p: "ext4",
        }
        args.update(kw)
        return unavailable_reason(
            str(args.pop("mode", "auto")),
            tmp_path,
            bool(args.pop("encrypted", False)),
            **args,  # type: ignore[arg-type]
        )

    assert check() == ""
    assert check(mode="off") == "--passthrough off"
    assert "built without passthrough" in check(library=lambda: False)
    assert "encrypted" in check(encrypted=True)
    assert "CAP_SYS_ADMIN" in check(privileged=lambda: False)
    assert "overlay" in check(fstype=lambda p: "overlay")


def test_capability_and_filesystem_probes(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tx\nCapEff:\t0000000000200000\n")  # bit 21 only
    assert has_cap_sys_admin(str(status))
    status.write_text("Name:\tx\nCapEff:\t00000000001fffff\n")  # everything below it
    assert not has_cap_sys_admin(str(status))
    assert not has_cap_sys_admin(str(tmp_path / "missing"))
    assert filesystem_type(Path("/")) != ""


def test_revocation_empties_evicted_block_files_of_revoked_snapshots_only(tmp_path: Path) -> None:
    kernel = FakeKernel()
    pt = Passthrough(open_backing=kernel.open, close_backing=kernel.close)
    data = b"revoked bytes" * 100
    paths = {}
    for inode, digest, snapshot in (
        (2, "own", "s1"),  # evicted, only in the revoked snapshot: emptied
        (3, "linked", "s1"),  # still in the cache: the daemon's purge decides
        (4, "both", "s1"),  # evicted, but a live snapshot's open file reads it too
        (5, "both", "s2"),
    ):
        path = tmp_path / digest
        if not path.exists():
            path.write_bytes(data)
        paths[digest] = path
        pt.attach(inode, _file(inode, len(data), snapshot=snapshot), digest, os.open(path, 0))
    watch = {d: os.open(p, os.O_RDONLY) for d, p in paths.items()}
    paths["own"].unlink()
    paths["both"].unlink()
    assert pt.revoke({"s1"}) == 1
    assert os.fstat(watch["own"]).st_size == 0
    assert os.pread(watch["linked"], 20, 0) == data[:20]
    assert os.pread(watch["both"], 20, 0) == data[:20]
    assert pt.revoke({"s1"}) == 0  # already empty
    assert pt.truncated == 1
    for fd in watch.values():
        os.close(fd)


@pytest.mark.parametrize("fatal", [errno.EOPNOTSUPP, errno.ENOTTY])
def test_stacked_or_unsupported_backing_files_turn_it_off(tmp_path: Path, fatal: int) -> None:
    pt = Passthrough(open_backing=FakeKernel(fatal).open, close_backing=lambda i: None)
    assert pt.attach(2, _file(2, 10), "d2-0", _fd(tmp_path)) is None
    assert not pt.enabled and os.strerror(fatal) in pt.reason


def test_an_inode_with_a_backing_id_keeps_sharing_it_after_passthrough_is_turned_off(
    tmp_path: Path,
) -> None:
    kernel = FakeKernel()
    pt = Passthrough(open_backing=kernel.open, close_backing=kernel.close)
    assert pt.attach(2, _file(2, 10), "d2-0", _fd(tmp_path)) == 1
    kernel.fail = errno.EPERM
    assert pt.attach(3, _file(3, 10), "d3-0", _fd(tmp_path, "other")) is None
    assert not pt.enabled and pt.candidate(4, _file(4, 10)) is None  # new inodes: pyfuse3
    assert pt.shared(2) == 1  # but inode 2's opens stay passthrough while it has some


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _idle_pt(kernel: FakeKernel, idle_max: int = 2) -> tuple[Passthrough, Clock]:
    clock = Clock()
    return Passthrough(
        open_backing=kernel.open, close_backing=kernel.close, idle_max=idle_max, clock=clock
    ), clock


def test_the_last_release_keeps_the_id_for_the_next_open_which_registers_nothing(
    tmp_path: Path,
) -> None:
    kernel = FakeKernel()
    pt, clock = _idle_pt(kernel)
    node = _file(2, 100)
    fd = _fd(tmp_path)
    assert pt.attach(2, node, "d2-0", fd) == 1
    pt.released(2, passthrough=True)
    assert kernel.open_ids == {1} and not _closed(fd)  # idle, still registered
    assert (pt.backing_ids, pt.idle_backing_ids, pt.reuses) == (1, 1, 0)
    for _ in range(3):  # open, release, again: one registration in all
        clock.now += 1  # re-checked each time (older than RECHECK_S): still linked
        assert pt.shared(2) == 1
        assert pt.idle_backing_ids == 0
        pt.released(2, passthrough=True)
    assert (pt.opens, pt.reuses, kernel.next_id) == (4, 3, 2)
    assert kernel.open_ids == {1} and pt.idle_backing_ids == 1


def test_idle_ids_are_bounded_oldest_released_closed_first(tmp_path: Path) -> None:
    kernel = FakeKernel()
    pt, _ = _idle_pt(kernel, idle_max=2)
    fds = {}
    for inode in (2, 3, 4):
        fds[inode] = _fd(tmp_path, f"b{inode}")
        assert pt.attach(inode, _file(inode, 100), f"d{inode}-0", fds[inode]) == inode - 1
    assert pt.backing_ids == 3 and pt.idle_backing_ids == 0  # open ones are never evicted
    for inode in (3, 2, 4):
        pt.released(inode, passthrough=True)
    assert kernel.open_ids == {1, 3}  # inode 3's (id 2), released first, closed
    assert _closed(fds[3]) and not _closed(fds[2]) and not _closed(fds[4])
    assert pt.shared(3) is None and pt.shared(2) == 1


def test_an_idle_id_whose_block_file_was_evicted_is_closed_not_reused(tmp_path: Path) -> None:
    kernel = FakeKernel()
    pt, clock = _idle_pt(kernel, idle_max=8)
    for inode in (2, 3, 4):
        pt.attach(inode, _file(inode, 100), f"d{inode}-0", _fd(tmp_path, f"b{inode}"))
        pt.released(inode, passthrough=True)
    (tmp_path / "b2").unlink()  # evicted by the daemon (or replaced by a rename)
    (tmp_path / "b3").unlink()
    clock.now += RECHECK_S / 2
    assert pt.shared(2) == 1  # checked less than RECHECK_S ago: reused as it is
    pt.released(2, passthrough=True)
    clock.now += RECHECK_S
    assert pt.shared(2) is None  # re-checked at the open: unlinked, closed
    assert kernel.open_ids == {2, 3} and pt.idle_backing_ids == 2
    assert pt.sweep() == 1  # the sweep finds inode 3's
    assert kernel.open_ids == {3} and pt.idle_backing_ids == 1
    assert pt.sweep() == 0 and pt.shared(4) == 3


def test_an_idle_id_is_not_taken_by_o_direct_beside_pyfuse3_handles_or_once_off(
    tmp_path: Path,
) -> None:
    kernel = FakeKernel()
    pt, _ = _idle_pt(kernel, idle_max=8)
    for inode in (2, 3):
        pt.attach(inode, _file(inode, 100), f"d{inode}-0", _fd(tmp_path, f"b{inode}"))
        pt.released(inode, passthrough=True)
    assert pt.shared(2, counted=False) is None  # O_DIRECT never starts passthrough
    pt.opened_cached(2)  # ... so it went the pyfuse3 path: no passthrough open beside it
    assert pt.shared(2) is None and pt.candidate(2, _file(2, 100)) is None
    pt.released(2, passthrough=False)
    assert pt.shared(2) == 1
    kernel.fail = errno.EPERM  # turned off: idle ids are closed, open ones stay shared
    assert pt.attach(4, _file(4, 100), "d4-0", _fd(tmp_path, "b4")) is None
    assert kernel.open_ids == {1} and pt.shared(3) is None
    pt.released(2, passthrough=True)  # its last handle, with passthrough off: closed
    assert kernel.open_ids == set() and pt.backing_ids == 0


def test_revocation_closes_idle_ids_of_revoked_snapshots(tmp_path: Path) -> None:
    kernel = FakeKernel()
    pt, _ = _idle_pt(kernel, idle_max=8)
    for inode, snapshot in ((2, "s1"), (3, "s2")):
        node = _file(inode, 100, snapshot=snapshot)
        pt.attach(inode, node, f"d{inode}-0", _fd(tmp_path, f"b{inode}"))
        pt.released(inode, passthrough=True)
    assert pt.revoke({"s1"}) == 0  # nothing emptied: the block files are in the cache
    assert kernel.open_ids == {2} and pt.shared(2) is None and pt.shared(3) == 2


def test_idle_ids_are_kept_within_half_the_open_file_limit() -> None:
    assert idle_backings(20_000) == 10_000
    assert idle_backings(1 << 20) == IDLE_BACKINGS
    assert idle_backings(-1) == IDLE_BACKINGS  # RLIM_INFINITY
    assert idle_backings(1) == 0
    assert active_backings(20_000) == 5_000  # a quarter: the rest for blocks and sockets
    assert active_backings(1 << 20) == active_backings(-1) == ACTIVE_BACKINGS


def test_past_the_active_bound_an_open_takes_the_pyfuse3_path(tmp_path: Path) -> None:
    """Issue 39's seventeenth probe: one user holding opens of 20,000 one-block files took
    every descriptor of the mount, and every other reader's open failed EIO."""
    kernel = FakeKernel()
    pt = Passthrough(open_backing=kernel.open, close_backing=kernel.close, active_max=3)
    for inode in (2, 3, 4):
        assert pt.attach(inode, _file(inode, 100), f"d{inode}-0", _fd(tmp_path, f"b{inode}"))
    assert pt.candidate(5, _file(5, 100)) is None  # a fourth inode: pyfuse3 path
    assert pt.over_active == 1
    assert pt.shared(2) is not None  # another open of a passthrough inode still shares
    pt.released(2, passthrough=True)
    pt.released(2, passthrough=True)  # inode 2 idle now: room for one more
    assert pt.candidate(5, _file(5, 100)) == "d5-0"


def test_idle_ids_past_the_descriptor_bound_keep_their_id_and_give_up_the_descriptor(
    tmp_path: Path,
) -> None:
    """Two idle ids may keep a descriptor, four in all: the oldest two give theirs up and
    are opened again by path when reused (no registration); past four, the oldest close."""
    kernel = FakeKernel()
    blocks = tmp_path / "blocks"
    blocks.mkdir()
    pt = Passthrough(
        open_backing=kernel.open,
        close_backing=kernel.close,
        idle_max=2,
        idle_ids=4,
        block_path=lambda digest: blocks / digest,
    )
    for inode in range(2, 7):
        node = _file(inode, 100)
        assert pt.attach(inode, node, f"d{inode}-0", _fd(blocks, f"d{inode}-0")) is not None
        pt.released(inode, passthrough=True)
    assert pt.idle_backing_ids == 4 and len(kernel.open_ids) == 4  # inode 2's closed
    assert pt.descriptors == 2  # inodes 5 and 6 keep theirs
    registered = kernel.next_id
    assert pt.shared(3) is not None  # fd-less: opened again by path, same file
    assert kernel.next_id == registered and pt.reuses == 1 and pt.descriptors == 3
    pt.released(3, passthrough=True)
    assert pt.descriptors == 2  # back under the bound: the oldest with one gave it up
    held = os.open(blocks / "d4-0", os.O_RDONLY)  # the kernel's reference to its file
    (blocks / "d4-0").unlink()  # evicted, then cached again: another file
    (blocks / "d4-0").write_bytes(b"y" * 100)
    assert pt.shared(4) is None  # not the file the kernel holds: the id is closed
    os.close(held)
    assert pt.idle_backing_ids == 3 and len(kernel.open_ids) == 3
    assert pt.shared(2) is None  # closed past the bound: the caller registers it anew


def test_a_sweep_closes_idle_ids_without_a_descriptor_whose_file_is_gone(
    tmp_path: Path,
) -> None:
    kernel = FakeKernel()
    blocks = tmp_path / "blocks"
    blocks.mkdir()
    pt = Passthrough(
        open_backing=kernel.open,
        close_backing=kernel.close,
        idle_max=1,
        block_path=lambda digest: blocks / digest,
    )
    for inode in (2, 3, 4):
        pt.attach(inode, _file(inode, 100), f"d{inode}-0", _fd(blocks, f"d{inode}-0"))
        pt.released(inode, passthrough=True)
    assert pt.descriptors == 1 and pt.idle_backing_ids == 3
    (blocks / "d2-0").unlink()
    assert pt.sweep() == 1
    assert pt.idle_backing_ids == 2 and len(kernel.open_ids) == 2
