"""An exclusive ``flock`` of an open file that one process may take again while holding it.

The inode journal and the backing ledger are shared by the mount workers of one FUSE
connection (fusemount/DESIGN.md, "Mount workers"); each process changes them only under
the file's lock, and a change may nest another (a snapshot's range reserved while a
version is numbered), so the lock counts its holders in this process.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator


class ReentrantFlock:
    """``flock(fd, LOCK_EX)`` taken at the outermost :meth:`held` and released when it
    ends (locks are per open file: every process opens the file itself).

    Args:
        fd: the open file (owned by the caller).
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self.depth = 0  # nesting of held() in this process; 0: not held

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Hold the lock for the ``with`` block.

        Raises:
            OSError: the kernel refused the lock (a closed descriptor).
        """
        if self.depth == 0:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if self.depth == 0:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
