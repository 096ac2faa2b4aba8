"""Blocks staged by the fetch threads: written to their temporary file before admission.

A receive thread of the bulk channel (:mod:`spoke.hublink.bulk`) holds a block in a
page-aligned buffer it re-uses; copying it into a new ``bytes`` for the event loop and
then writing that from the loop's writer thread cost a copy, a thread hand-off and the
loop's time per block. Instead the thread writes it to the block's temporary file
(:meth:`spoke.cache.store.BlockStore.stage`) and hands the loop a :class:`Staged`; the
cache admits it as any block (room first, by the policy, on the loop) and its batched
write renames the file into place instead of writing it. The one-writer rule holds: the
daemon writes every block file; a staged file is not a block until the rename, which the
admission makes.

Blocks of :data:`DIRECT_MIN_BYTES` or more fetched ahead of any reader (prewarm, fill,
hints, readahead) are written with ``O_DIRECT`` (:func:`write_block_file`): the page
cache is bypassed, so the write costs the kernel no copy and no writeback. On this VM
buffered writes of 4 MiB files cost 0.2 CPU-s per GiB while the page cache absorbs them
and 2.3–2.8 once writeback runs; direct writes 0.08–0.10 at 1.3–1.4 GiB/s
(``BENCHMARKS.md``, "Ingest on loopback"). A demand miss is written through the page
cache, where its reader, waiting, reads it next.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from dataclasses import dataclass

DIRECT_MIN_BYTES = 1 << 20
"""Smallest block written with ``O_DIRECT``: below it the synchronous device write per
block costs more than the page cache's copy (64 KiB files here: 252–264 MiB/s direct
against 388–512 buffered at the same CPU; 1 MiB: 0.14 CPU-s/GiB direct against
0.22–0.35 buffered)."""

ALIGN = 4096
"""``O_DIRECT``'s alignment of buffer address, length and file offset (the logical block
size of every disk we run on is 512 or 4,096 bytes)."""


@dataclass(frozen=True, slots=True)
class Staged:
    """A verified block in its temporary file, waiting for admission.

    Attributes:
        digest: The block's digest.
        size: Its bytes (plaintext; the file may be sealed, larger).
        path: The temporary file, beside the block's path.
        sealed: Whether the file holds the block sealed (encryption at rest).
    """

    digest: str
    size: int
    path: str
    sealed: bool = False

    def __len__(self) -> int:
        return self.size

    def discard(self) -> None:
        """Deletes the temporary file (a block not admitted)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


class DirectWrites:
    """Whether ``O_DIRECT`` works on the cache's filesystem: tried until a write is
    refused with ``EINVAL`` (tmpfs, some FUSE and network filesystems), then never again."""

    def __init__(self) -> None:
        self.usable = True


def write_block_file(
    path: str, data: bytes | bytearray | memoryview, direct: DirectWrites | None
) -> None:
    """Writes ``data`` to a new file at ``path`` (truncating a leftover); with ``direct``,
    its aligned part with ``O_DIRECT`` and the tail through the page cache.

    ``data`` must then start on an :data:`ALIGN` boundary in memory (an ``mmap``'s
    buffer): a misaligned one, or a filesystem without ``O_DIRECT``, falls back to a
    buffered write (``direct.usable`` is cleared for the filesystem's refusal).

    Raises:
        OSError: the write failed; the file may be left partial (the caller deletes it).
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    view = memoryview(data).cast("B")
    aligned = len(view) - len(view) % ALIGN if direct is not None and direct.usable else 0
    fd = -1
    if aligned:
        try:
            fd = os.open(path, flags | os.O_DIRECT, 0o600)
        except OSError as err:
            if err.errno != errno.EINVAL:
                raise
            direct.usable = False  # type: ignore[union-attr]  # aligned > 0: not None
            aligned = 0
    if fd < 0:
        fd = os.open(path, flags, 0o600)
    try:
        done = 0
        if aligned:
            try:
                while done < aligned:
                    done += os.write(fd, view[done:aligned])
            except OSError as err:
                if err.errno != errno.EINVAL or done:
                    raise
                # refused (a filesystem that opens O_DIRECT and will not write it, or a
                # misaligned buffer, which our callers never pass): the page cache from now
                direct.usable = False  # type: ignore[union-attr]
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)
        while done < len(view):
            done += os.write(fd, view[done:])
    finally:
        os.close(fd)
