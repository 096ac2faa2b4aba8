"""What a successor mount process needs to resume a FUSE connection, without a kernel:
the inode journal numbers every node the same way, file handles carry their inode, and the
backing ledger hands over backing ids and handle counts exactly."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from fusemount.handles import file_handle, handle_inode
from fusemount.journal import InodeJournal, read_journal
from fusemount.ledger import CHUNK_SLOTS, BackingLedger
from fusemount.passthrough import Passthrough
from fusemount.tree import DIR_MODE, LINK_MODE, InodeTable, Node, Role
from protocol.hub.v1 import hub_pb2


def _entries(count: int) -> list[hub_pb2.ManifestEntry]:
    out = []
    for i in range(count):  # nested paths whose parents are not listed: implicit dirs
        out.append(
            hub_pb2.ManifestEntry(
                path=f"d{i % 3}/e{i:03d}/f", type=hub_pb2.ENTRY_TYPE_FILE, size=10,
                blocks=[hub_pb2.BlockRef(digest=f"{i:064x}", size=10)],
            )
        )  # fmt: skip
    return out


def _all_nodes(table: InodeTable, *snapshots: str) -> dict[int, Node]:
    """Every node of ``table``: its own and the entries of ``snapshots``, made now."""
    out = {n.inode: n for n in table.nodes()}
    for sid in snapshots:
        out.update((i, table[i]) for i in table.entry_inodes(sid))
    return out


def _fill(table: InodeTable) -> None:
    for ds in ("a", "b"):
        table.intern(("dataset", ds), Node(0, Role.DATASET, DIR_MODE, dataset=ds))
    v1 = table.intern(
        ("version", "a", "v1"),
        Node(0, Role.VERSION, DIR_MODE, dataset="a", version="v1", snapshot_id="s1"),
    )
    table.intern(
        ("tag", "a", "latest"),
        Node(0, Role.TAG, LINK_MODE, size=2, dataset="a", version="v1", target=b"v1"),
    )
    table.load_snapshot(v1, "s1", _entries(50))
    v2 = table.intern(
        ("version", "a", "v2"),
        Node(0, Role.VERSION, DIR_MODE, dataset="a", version="v2", snapshot_id="s2"),
    )
    table.load_snapshot(v2, "s2", _entries(20))


def test_a_successor_numbers_every_node_as_its_predecessor_did(tmp_path: Path) -> None:
    journal = tmp_path / "fuse-inodes.jsonl"
    first = InodeTable(InodeJournal(journal, fresh=True))
    _fill(first)
    nodes = _all_nodes(first, "s1", "s2")
    records = read_journal(journal)
    assert len(records) == 7  # 2 datasets, 2 versions, 1 tag, 2 snapshots: one line each
    second = InodeTable(InodeJournal(journal, fresh=False))
    second.replay(records)
    assert second.referenced(12345)  # the kernel's earlier references are unknown
    entry = max(i for i, n in nodes.items() if n.role is Role.ENTRY and n.snapshot_id == "s1")
    assert second.get(entry) is None
    root = second.pending_root(entry)
    assert root is not None and (root.dataset, root.version) == ("a", "v1")
    second.load_snapshot(root, "s1", _entries(50))  # what the namespace does on demand
    for inode, node in nodes.items():
        if node.snapshot_id == "s2" and node.role is Role.ENTRY:
            assert second.get(inode) is None  # not loaded yet: still pending
            continue
        mine = second.get(inode)
        assert mine is not None, inode
        assert (mine.role, mine.mode, mine.size, mine.dataset, mine.version) == (
            node.role, node.mode, node.size, node.dataset, node.version,
        )  # fmt: skip
        assert mine.target == node.target and mine.blocks == node.blocks
    # new numbers continue after every number given out before
    later = second.intern(("dataset", "c"), Node(0, Role.DATASET, DIR_MODE, dataset="c"))
    assert later.inode > max(nodes)
    assert second.pending_root(later.inode) is None


def test_a_torn_last_journal_line_is_skipped(tmp_path: Path) -> None:
    journal = tmp_path / "j"
    table = InodeTable(InodeJournal(journal, fresh=True))
    _fill(table)
    with open(journal, "ab") as f:
        f.write(b'{"key": ["dataset", "x"], "ino')
    assert len(read_journal(journal)) == 7


def test_file_handles_carry_inode_and_passthrough() -> None:
    for inode in (2, 123_456_789, (1 << 48) - 1):
        for passthrough in (False, True):
            fh = file_handle(inode, passthrough, 40_000)
            assert fh < 1 << 64 and handle_inode(fh) == (inode, passthrough)
    assert file_handle(7, False, 1) != file_handle(7, False, 2)


def _node(inode: int, digest: str) -> Node:
    return Node(inode, Role.ENTRY, stat.S_IFREG | 0o444, size=5, blocks=((digest, 5),),
                snapshot_id="s1")  # fmt: skip


def test_a_successor_adopts_backing_ids_and_handle_counts(tmp_path: Path) -> None:
    blocks = tmp_path / "blocks"
    blocks.mkdir()
    ids = iter(range(100, 200))
    closed: list[int] = []
    first = Passthrough(
        open_backing=lambda fd: next(ids), close_backing=closed.append,
        ledger=BackingLedger(tmp_path / "ledger", fresh=True),
    )  # fmt: skip
    for inode, digest in ((10, "aa" * 16), (11, "bb" * 16)):
        (blocks / digest).write_bytes(b"12345")
        fd = os.open(blocks / digest, os.O_RDONLY)
        assert first.attach(inode, _node(inode, digest), digest, fd) is not None
    assert first.shared(10) == 100  # a second passthrough handle of inode 10
    first.released(11, True)  # inode 11 idle
    first.opened_cached(12)  # inode 12: one handle on the pyfuse3 path
    (blocks / ("bb" * 16)).unlink()  # evicted since
    # the predecessor is gone (SIGKILL: nothing closed); the successor reads the ledger
    ledger = BackingLedger(tmp_path / "ledger", fresh=False)
    second = Passthrough(
        open_backing=lambda fd: 999, close_backing=closed.append, ledger=ledger,
        block_path=lambda d: blocks / d,
    )  # fmt: skip
    assert second.adopt(ledger.records()) == 2
    assert second.shared(10) == 100  # the kernel's id, never a second one (EBUSY)
    assert second.candidate(12, _node(12, "cc" * 16)) is None  # pyfuse3 handles still open
    assert second.shared(11) is None and closed == [101]  # idle, its block gone: closed
    for _ in range(3):
        second.released(10, True)
    assert second.idle_backing_ids == 1
    second.released(12, False)
    assert second.candidate(12, _node(12, "cc" * 16)) == "cc" * 16
    assert {r.inode for r in ledger.records()} == {10}


def test_the_ledger_grows_past_its_first_slots(tmp_path: Path) -> None:
    ledger = BackingLedger(tmp_path / "ledger", fresh=True)
    far = CHUNK_SLOTS * 2 + 5  # slots are indexed by inode: this one needs a third chunk
    for inode in (1, 2, far):
        ledger.put(inode, 0, 0, 1, "")
    ledger.drop(1)
    again = BackingLedger(tmp_path / "ledger", fresh=False)
    assert [r.inode for r in again.records()] == [2, far]
    assert not ledger.failed


def test_two_processes_share_one_backing_id_and_its_counts(tmp_path: Path) -> None:
    """Two mount workers on one connection: the second shares the id the first
    registered (never a second one: EBUSY), and the last release anywhere makes it idle,
    which either may close."""
    blocks = tmp_path / "blocks"
    blocks.mkdir()
    digest = "ab" * 16
    (blocks / digest).write_bytes(b"12345")
    registered: list[int] = []
    closed: list[int] = []

    def worker(fresh: bool) -> Passthrough:
        return Passthrough(
            open_backing=lambda fd: registered.append(fd) or 7, close_backing=closed.append,
            ledger=BackingLedger(tmp_path / "ledger", fresh=fresh),
            block_path=lambda d: blocks / d, exclusive=False,
        )  # fmt: skip

    a, b = worker(True), worker(False)
    node = _node(30, digest)
    assert a.attach(30, node, digest, os.open(blocks / digest, os.O_RDONLY)) == 7
    assert b.candidate(30, node) == digest
    assert b.shared(30) == 7 and len(registered) == 1  # b shares a's id
    a.released(30, True)  # a's handle
    assert b.shared(30) == 7  # a third handle, through b
    b.released(30, True)
    b.released(30, True)  # the last one, released by b: idle
    assert a.shared(30) == 7 and a.reuses == 1 and closed == []  # a takes it again
    a.released(30, True)
    b.opened_cached(31)
    assert a.candidate(31, _node(31, digest)) is None  # b's pyfuse3 handle counts for a
    assert b.shared(30) == 7
    b.idle_max = 0  # b keeps no idle ids: its release closes the kernel's id, once
    b.released(30, True)
    assert closed == [7] and len(registered) == 1
    assert a.backing_ids == 1 and a.reconcile() == 1 and a.backing_ids == 0  # a forgets it
    assert a.shared(30) is None


def test_two_journals_give_out_numbers_without_collisions(tmp_path: Path) -> None:
    journal = tmp_path / "fuse-inodes.jsonl"
    a = InodeTable(InodeJournal(journal, fresh=True))
    b = InodeTable(InodeJournal(journal, fresh=False))
    da = a.intern(("dataset", "x"), Node(0, Role.DATASET, DIR_MODE, dataset="x"))
    db = b.intern(("dataset", "y"), Node(0, Role.DATASET, DIR_MODE, dataset="y"))
    again = b.intern(("dataset", "x"), Node(0, Role.DATASET, DIR_MODE, dataset="x"))
    assert da.inode != db.inode and again.inode == da.inode
    va = a.intern(
        ("version", "x", "v1"),
        Node(0, Role.VERSION, DIR_MODE, dataset="x", version="v1", snapshot_id="s1"),
    )
    a.load_snapshot(va, "s1", _entries(30))
    vb = b.intern(
        ("version", "y", "v1"),
        Node(0, Role.VERSION, DIR_MODE, dataset="y", version="v1", snapshot_id="s2"),
    )
    b.load_snapshot(vb, "s2", _entries(10))  # its range after a's, which it reads first
    first_a = min(a.entry_inodes("s1"))
    b.sync()
    root = b.pending_root(first_a)
    assert root is not None and root.inode == va.inode  # b finds a's node by its number
    b.load_snapshot(root, "s1", _entries(30))
    assert b.get(first_a) is not None and b.get(first_a).blocks == a.get(first_a).blocks
    numbers = list(_all_nodes(b, "s1", "s2"))
    assert len(numbers) == len(b)
    assert len(numbers) == len(set(numbers))
    with open(journal, "ab") as f:  # a killed writer's torn line: the next line still counts
        f.write(b'{"key": ["dataset", "z"], "ino')
    dz = a.intern(("dataset", "z"), Node(0, Role.DATASET, DIR_MODE, dataset="z"))
    b.sync()
    assert b.intern(("dataset", "z"), Node(0, Role.DATASET, DIR_MODE)).inode == dz.inode


@pytest.mark.parametrize("mode", ["off"])
def test_hand_over_off_is_said(mode: str) -> None:
    from spoke.disk.handover import unavailable_reason

    assert unavailable_reason(mode) == "--mount-handover off"


def test_an_open_that_found_no_id_shares_one_attached_meanwhile(tmp_path: Path) -> None:
    """An open decided for the pyfuse3 path while another worker attached a backing id
    joins that id (mixing the two would fail the open) instead of counting a pyfuse3
    handle; the id's snapshot is found from the inode's range."""
    blocks = tmp_path / "blocks"
    blocks.mkdir()
    digest = "cd" * 16
    (blocks / digest).write_bytes(b"12345")

    def worker(fresh: bool) -> Passthrough:
        return Passthrough(
            open_backing=lambda fd: 9, close_backing=lambda i: None,
            ledger=BackingLedger(tmp_path / "ledger", fresh=fresh),
            block_path=lambda d: blocks / d, exclusive=False, snapshot_of=lambda i: "s9",
        )  # fmt: skip

    a, b = worker(True), worker(False)
    assert a.attach(40, _node(40, digest), digest, os.open(blocks / digest, os.O_RDONLY)) == 9
    assert b.opened_cached(40) == 9  # joins a's id: no pyfuse3 handle counted
    assert BackingLedger(tmp_path / "ledger", fresh=False).get(40).handles == 2
    assert b.opened_cached(41) is None  # no id: a pyfuse3 handle, seen by a
    assert a.candidate(41, _node(41, digest)) is None
    a.released(40, True)
    b.released(40, True)  # the last handle: idle in b, whose revocation closes it
    assert b.idle_backing_ids == 1 and b.revoke(["s9"]) == 0 and b.idle_backing_ids == 0


def test_a_lost_journal_line_fails_the_request_when_workers_share_it(tmp_path: Path) -> None:
    table = InodeTable(InodeJournal(tmp_path / "j", fresh=True))
    assert table.journal is not None
    table.journal.shared = True
    os.close(table.journal._fd)  # the disk refuses every write from now on
    table.journal._fd = os.open(tmp_path / "j", os.O_RDONLY)
    with pytest.raises(OSError):
        table.intern(("dataset", "x"), Node(0, Role.DATASET, DIR_MODE, dataset="x"))
    assert table.journal.failed
