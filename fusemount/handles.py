"""The mount's open file handles: numbers that carry their inode (a successor serving the
same FUSE connection reads a handle by that alone), each handle's state, and how many
handles each user holds.

A handle is the inode's 48 bits, a passthrough bit and 15 bits of serial. Opens of one
inode past 32,768 at once share a handle (counted: it lives until its last release),
after at most :data:`HANDLE_TRIES` serials tried: before, the next open failed ``ENFILE``
for everyone after trying all 32,768 (issue 39's seventeenth probe). A handle's state (its
node, its readahead) is about 0.9 KiB, so a user holds at most :data:`USER_HANDLES` at
once, and beyond, that user's opens fail ``EMFILE`` (the eighteenth probe: one uid's
114,000 opens of distinct files took the mount from 64 to 183 MiB, with no bound).
"""

from __future__ import annotations

import errno

import pyfuse3

from fusemount.readahead import Readahead
from fusemount.tree import INODE_BITS, Node

_INODE_MASK = (1 << INODE_BITS) - 1
_FH_PASSTHROUGH = 1 << INODE_BITS
_FH_SERIALS = 1 << (63 - INODE_BITS)  # 15 bits: the handle's serial

HANDLE_TRIES = 64
"""Most serials tried for a new open's handle before it shares one of its inode's."""

USER_HANDLES = 262_144
"""Most handles one user (uid) holds open at once: about 230 MiB of the mount."""

Handle = tuple[Node, Readahead, bool]
"""A handle's state: its node, its readahead and whether it is a passthrough open."""


def file_handle(inode: int, passthrough: bool, serial: int) -> int:
    """The 64-bit FUSE file handle of an open: bits 0-47 the inode, bit 48 set for a
    passthrough open, bits 49-63 a serial (``serial`` modulo 2**15) that tells apart
    opens of one inode."""
    return inode | (_FH_PASSTHROUGH if passthrough else 0) | (serial % _FH_SERIALS) << 49


def handle_inode(fh: int) -> tuple[int, bool]:
    """``(inode, passthrough)`` of a handle made by :func:`file_handle`."""
    return fh & _INODE_MASK, bool(fh & _FH_PASSTHROUGH)


class Handles:
    """The handles this process gave out (and those of a predecessor it met since).

    Args:
        per_user: Most handles one uid holds at once (:data:`USER_HANDLES`).

    Not thread-safe: the mount's trio loop owns it.
    """

    def __init__(self, per_user: int = USER_HANDLES) -> None:
        self.per_user = per_user
        self._state: dict[int, Handle] = {}
        self._openers: dict[int, list[int]] = {}  # fh -> the uids holding it, one an open
        self._held: dict[int, int] = {}  # uid -> handles it holds
        self._serial = 0

    def __contains__(self, fh: int) -> bool:
        return fh in self._state

    def get(self, fh: int) -> Handle | None:
        """The state of ``fh``, or None (not given out here)."""
        return self._state.get(fh)

    def adopt(self, fh: int, state: Handle) -> None:
        """Keeps the state of a handle a predecessor gave out (counted for no user)."""
        self._state[fh] = state

    def check(self, uid: int) -> None:
        """Refuses a new open by ``uid`` past :attr:`per_user`.

        Raises:
            pyfuse3.FUSEError: ``EMFILE``.
        """
        if self._held.get(uid, 0) >= self.per_user:
            raise pyfuse3.FUSEError(errno.EMFILE)

    def open(self, inode: int, passthrough: bool, uid: int, state: Handle) -> int:
        """A handle for a new open of ``inode`` by ``uid``: a free serial, else (after
        :data:`HANDLE_TRIES` taken ones) an open handle of the same inode, shared."""
        for _ in range(HANDLE_TRIES):
            self._serial += 1
            fh = file_handle(inode, passthrough, self._serial)
            if fh not in self._state:
                break
        self._state.setdefault(fh, state)
        self._openers.setdefault(fh, []).append(uid)
        self._held[uid] = self._held.get(uid, 0) + 1
        return fh

    def release(self, fh: int) -> None:
        """One open of ``fh`` ended; its state goes with the last."""
        openers = self._openers.get(fh)
        if openers:
            uid = openers.pop()
            left = self._held[uid] - 1
            if left:
                self._held[uid] = left
            else:
                del self._held[uid]
            if openers:
                return  # another open shares it
            del self._openers[fh]
        self._state.pop(fh, None)

    def held(self, uid: int) -> int:
        """How many handles ``uid`` holds."""
        return self._held.get(uid, 0)
