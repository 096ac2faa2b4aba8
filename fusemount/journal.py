"""The inode journal: how this FUSE connection's inode numbers were given out.

The kernel keeps the inode numbers and file handles a mount process gave it for as long
as the connection lives. When a successor process resumes the connection (mount
hand-over, :mod:`spoke.disk.handover`), it must answer requests about inodes it never
looked up itself with the same nodes. Numbers are given out in a deterministic order —
one number per dataset, version and tag as first seen, and one contiguous range per
snapshot, numbered in the manifest's order (:meth:`fusemount.tree.InodeTable.load_snapshot`)
— so this journal only needs one line per such node and one per snapshot range. It is
append-only (JSON lines, ``CACHE_DIR/private/fuse-inodes.jsonl``): a dataset listing or a
snapshot load writes one line (a few hundred bytes), never a line per file, and a process
killed mid-write leaves at most a torn last line, which :func:`read_journal` skips.

Several mount workers serving one connection (``--mount-workers``) share the journal: a
worker gives out a new number only under an exclusive ``flock`` of the file
(:meth:`InodeJournal.allocating`), after reading what the others appended since it last
looked (:meth:`InodeJournal.new_records`), so every number means one node in every worker.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
from pathlib import Path
from typing import Any

from fusemount.flock import ReentrantFlock

log = logging.getLogger(__name__)


class InodeJournal:
    """Appends records to the journal file.

    Args:
        path: the journal file (owner-only: the cache's private directory).
        fresh: start a new journal (a new FUSE connection) rather than append to the one a
            predecessor serving the same connection wrote.

    Raises:
        OSError: the file cannot be opened.
    """

    def __init__(self, path: Path, fresh: bool) -> None:
        self.path = path
        flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        self._fd = os.open(path, flags | (os.O_TRUNC if fresh else 0), 0o600)
        self.failed = False
        self._offset = 0  # how far this process has read the file
        self._torn = False  # the bytes read so far end inside a line (a killed writer's)
        self._lock = ReentrantFlock(self._fd)
        self.shared = False  # other workers read it: a lost line must fail the request

    def allocating(self) -> contextlib.AbstractContextManager[None]:
        """Hold the journal's exclusive lock (``flock``; re-entrant in this process): the
        caller reads :meth:`new_records` and appends its new numbers before it ends."""
        return self._lock.held()

    def new_records(self) -> list[dict[str, Any]]:
        """The records appended since the last call (by this or another process), whole
        lines only; a torn line is skipped.

        Raises:
            OSError: the file cannot be read.
        """
        chunks = []
        while True:
            chunk = os.pread(self._fd, 1 << 20, self._offset)
            if not chunk:
                break
            chunks.append(chunk)
            self._offset += len(chunk)
        data = b"".join(chunks)
        end = data.rfind(b"\n") + 1
        if end < len(data):
            if self._lock.depth:  # no one writes while we hold the lock: a killed writer tore it
                self._torn = True
            else:  # perhaps a line being written: read it again next time
                self._offset -= len(data) - end
                data = data[:end]
        elif data:
            self._torn = False
        records = []
        for line in data.splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                log.warning("inode journal %s: skipped a torn line", self.path)
        return records

    def append(self, record: dict[str, Any]) -> None:
        """Write one record (one ``write``: a whole line, after a newline that ends a line a
        killed writer tore). A failed write is logged once and leaves hand-over of this
        connection unsafe (:attr:`failed`), not the mount, unless other workers read the
        journal (:attr:`shared`): then it raises OSError and the request that needed the
        number fails, rather than two nodes sharing it. Call it under
        :meth:`allocating` after :meth:`new_records` when other processes share the file."""
        line = ("\n" if self._torn else "") + json.dumps(record, separators=(",", ":")) + "\n"
        data = line.encode()
        try:
            if os.write(self._fd, data) != len(data):
                raise OSError(errno.ENOSPC, "short write")
            self._torn = False
            if self._lock.depth:  # we had read to the end under the lock: skip our own line
                self._offset += len(data)
        except OSError as err:
            if not self.failed:
                log.error("inode journal %s: %s; a successor could not resume", self.path, err)
            self.failed = True
            if self.shared:  # another worker would give the same number to another node
                raise

    def close(self) -> None:
        """Close the file (records already written stay)."""
        os.close(self._fd)


def read_journal(path: Path) -> list[dict[str, Any]]:
    """The records of a journal, in order; a torn last line is skipped.

    Raises:
        OSError: the file cannot be read.
    """
    records = []
    for line in path.read_bytes().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            log.warning("inode journal %s: skipped a torn line", path)
    return records
