"""The inode journal: how this FUSE connection's inode numbers were given out.

The kernel keeps the inode numbers and file handles a mount process gave it for as long
as the connection lives. When a successor process resumes the connection (mount
hand-over, :mod:`fusemount.handover`), it must answer requests about inodes it never
looked up itself with the same nodes. Numbers are given out in a deterministic order —
one number per dataset, version and tag as first seen, and one contiguous range per
snapshot, numbered in the manifest's order (:meth:`fusemount.tree.InodeTable.load_snapshot`)
— so this journal only needs one line per such node and one per snapshot range. It is
append-only (JSON lines, ``CACHE_DIR/private/fuse-inodes.jsonl``): a dataset listing or a
snapshot load writes one line (a few hundred bytes), never a line per file, and a process
killed mid-write leaves at most a torn last line, which :func:`read_journal` skips.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

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
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        self._fd = os.open(path, flags | (os.O_TRUNC if fresh else 0), 0o600)
        self.failed = False

    def append(self, record: dict[str, Any]) -> None:
        """Write one record (one ``write``: a whole line). A failed write is logged once and
        leaves hand-over of this connection unsafe (:attr:`failed`), not the mount."""
        line = json.dumps(record, separators=(",", ":")) + "\n"
        try:
            os.write(self._fd, line.encode())
        except OSError as err:
            if not self.failed:
                log.error("inode journal %s: %s; a successor could not resume", self.path, err)
            self.failed = True

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
