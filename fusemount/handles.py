"""The mount's open file handles: numbers that carry their inode (a successor serving the
same FUSE connection reads a handle by that alone), each handle's state, and how many
handles each opener holds.

A handle is the inode's 48 bits, a passthrough bit and 15 bits of serial. Opens of one
inode past 32,768 at once share a handle (counted: it lives until its last release),
after at most :data:`HANDLE_TRIES` serials tried: before, the next open failed ``ENFILE``
for everyone after trying all 32,768 (issue 39's seventeenth probe).

A handle's state (its node, its readahead) is about 0.45 KiB, so what opens may hold is
bounded, and counted by handle, for the opener that made it
(:class:`fusemount.openers.Opener`: a cgroup's owner, a pod, not a uid — pods share
uids, the nineteenth probe, and a root pod sets any uid it likes, the twentieth): an
open that shares a handle adds no state and is counted for nobody (a release cannot
tell who closes, and counting it moved counts between uids, the nineteenth probe's F5).
An opener holds at most :data:`OPENER_HANDLES`; and once the node's handles reach
:data:`NODE_HANDLES`, one holding :data:`OPENER_FLOOR` or more is refused too, so many
openers cannot add up to the mount's memory (the nineteenth probe: each uid's 262,144
opens added 117 MiB). Refused is ``EMFILE``.
"""

from __future__ import annotations

import errno

import pyfuse3

from fusemount.openers import Opener
from fusemount.readahead import Readahead
from fusemount.tree import INODE_BITS, Node

_INODE_MASK = (1 << INODE_BITS) - 1
_FH_PASSTHROUGH = 1 << INODE_BITS
_FH_SERIALS = 1 << (63 - INODE_BITS)  # 15 bits: the handle's serial

HANDLE_TRIES = 64
"""Most serials tried for a new open's handle before it shares one of its inode's."""

OPENER_HANDLES = 262_144
"""Most handles one opener holds at once: about 117 MiB of the mount."""

NODE_HANDLES = 1_048_576
"""Handles of all openers together past which only an opener holding fewer than
:data:`OPENER_FLOOR` may open: about 470 MiB of the mount, and at most openers ×
OPENER_FLOOR more (a share of the rest, cap ÷ (openers + 1), let each new opener add its
share: the twentieth probe filled 1.9 M handles, 983 MiB, and counted 6.5 M at 1,000
openers)."""

OPENER_FLOOR = 4_096
"""Handles every opener may hold however full the node is (about 2 MiB of the mount)."""

TRIM_FREED = 65_536
"""Handles freed between two returns of the freed heap to the kernel
(:func:`strata_local.memory.trim_malloc`): handles freed in the middle of the heap stayed
the mount's (the nineteenth probe: 495 of 531 MiB after every holder closed)."""

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
        per_opener: Most handles one opener holds at once (:data:`OPENER_HANDLES`).
        node: Handles past which only openers under ``floor`` may open
            (:data:`NODE_HANDLES`).
        floor: Handles every opener may hold (:data:`OPENER_FLOOR`).

    Not thread-safe: the mount's trio loop owns it.
    """

    def __init__(
        self, per_opener: int = OPENER_HANDLES, node: int = NODE_HANDLES, floor: int = OPENER_FLOOR
    ) -> None:
        self.per_opener = per_opener
        self.node = node
        self.floor = floor
        self._state: dict[int, Handle] = {}
        self._opens: dict[int, tuple[Opener, int]] = {}  # fh -> who made it, its opens
        self._held: dict[Opener, int] = {}  # opener -> handles it made, still open
        self._total = 0  # handles counted for openers
        self._freed = 0  # handles freed since the last trim
        self._peak = 0  # most handles since the tables were last copied
        self._serial = 0

    def __contains__(self, fh: int) -> bool:
        return fh in self._state

    def get(self, fh: int) -> Handle | None:
        """The state of ``fh``, or None (not given out here)."""
        return self._state.get(fh)

    def adopt(self, fh: int, state: Handle) -> None:
        """Keeps the state of a handle a predecessor gave out (counted for no opener)."""
        self._state[fh] = state

    def check(self, opener: Opener) -> None:
        """Refuses a new open by ``opener`` past :attr:`per_opener`, or past :attr:`floor`
        once the node's handles reach :attr:`node`.

        Raises:
            pyfuse3.FUSEError: ``EMFILE``.
        """
        held = self._held.get(opener, 0)
        if held >= self.per_opener or (self._total >= self.node and held >= self.floor):
            raise pyfuse3.FUSEError(errno.EMFILE)

    def open(self, inode: int, passthrough: bool, opener: Opener, state: Handle) -> int:
        """A handle for a new open of ``inode`` by ``opener``: a free serial, else (after
        :data:`HANDLE_TRIES` taken ones) an open handle of the same inode, shared."""
        for _ in range(HANDLE_TRIES):
            self._serial += 1
            fh = file_handle(inode, passthrough, self._serial)
            if fh not in self._state:
                break
        made = self._opens.get(fh)
        if made is not None:  # shared: no new state, counted for its maker already
            self._opens[fh] = (made[0], made[1] + 1)
            return fh
        if fh not in self._state:  # (a predecessor's adopted handle is nobody's)
            self._state[fh] = state
            self._peak = max(self._peak, len(self._state))
            self._opens[fh] = (opener, 1)
            self._held[opener] = self._held.get(opener, 0) + 1
            self._total += 1
        return fh

    def release(self, fh: int) -> bool:
        """One open of ``fh`` ended; its state goes with the last. Returns whether enough
        handles were freed since the last time it said so (:data:`TRIM_FREED`) that the
        freed heap should go back to the kernel."""
        made = self._opens.get(fh)
        if made is not None:
            opener, opens = made
            if opens > 1:
                self._opens[fh] = (opener, opens - 1)
                return False  # another open shares it
            del self._opens[fh]
            left = self._held[opener] - 1
            if left:
                self._held[opener] = left
            else:
                del self._held[opener]
            self._total -= 1
        if self._state.pop(fh, None) is not None:
            self._freed += 1
            if self._freed >= TRIM_FREED:
                self._freed = 0
                if len(self._state) * 4 < self._peak:  # a dict never shrinks as its keys
                    # go: copies are sized to what is left (only once it is a quarter: a
                    # copy on the loop of 1 M handles took 77 ms, the twentieth probe)
                    self._state, self._opens = dict(self._state), dict(self._opens)
                    self._peak = len(self._state)
                return True
        return False

    def held(self, opener: Opener) -> int:
        """How many handles ``opener`` made that are still open."""
        return self._held.get(opener, 0)
