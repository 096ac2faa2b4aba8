"""A cached block's file read a chunk at a time, for the peer port.

The owner checks a block before it sends a byte of it, as it always has, but no longer
holds it whole: :meth:`BlockFile.open` reads the file once, a chunk at a time, against the
block's digest (with encryption at rest, every segment authenticated as well), and keeps
the file open; the peer port then reads each chunk again from that descriptor as the
caller takes the previous one (the page cache has it). Block files are replaced by a
rename, never written in place, so the descriptor reads the bytes that were checked even
if the block is evicted or fetched again meanwhile. A stalled caller costs this spoke one
chunk and a descriptor, not the block and copies of its chunks.
"""

from __future__ import annotations

import os
from types import TracebackType

import xxhash

from spoke.cache.store import BlockStore
from spoke.disk.encryption import HEADER_BYTES, SEGMENT_BYTES, TAG_BYTES, BlockCipher, CorruptBlock


class BlockFile:
    """One cached block's open file (made by :meth:`open`); a context manager that closes it.

    Args:
        fd: the file, open for reading.
        digest: the block's digest.
        size: its size, bytes.
        chunk: bytes per chunk read (a multiple of the encryption's segments).
        cipher: the spoke's block cipher, or None (blocks stored as they are).
    """

    def __init__(
        self, fd: int, digest: str, size: int, chunk: int, cipher: BlockCipher | None
    ) -> None:
        if chunk <= 0 or chunk % SEGMENT_BYTES:
            raise ValueError(f"a chunk is a positive multiple of {SEGMENT_BYTES} bytes")
        self.fd = fd
        self.digest = digest
        self.size = size
        self.chunk = chunk
        header = os.pread(fd, HEADER_BYTES, 0) if cipher is not None else b""
        self._key = cipher.file_key(digest, header) if cipher is not None else None
        self._only: bytes | None = None  # a one-chunk block's bytes, as checked

    @classmethod
    def open(cls, store: BlockStore, digest: str, size: int, chunk: int) -> BlockFile | None:
        """The file of cached block ``digest`` of ``size`` bytes, open and checked: every
        chunk read once and the whole against the digest. None if it is absent, of
        another size or not that block's bytes (it may block on the disk: call it from a
        worker thread).

        Raises:
            ValueError: ``chunk`` is not a positive multiple of the encryption's segments.
        """
        try:
            fd = os.open(store.layout.block_path(digest), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            expected = size if store.cipher is None else store.cipher.sealed_size(size)
            if os.fstat(fd).st_size != expected:
                raise CorruptBlock(f"block file of {digest} has another size")
            block = cls(fd, digest, size, chunk, store.cipher)
            hasher = xxhash.xxh3_128()
            data = b""
            for offset in block.offsets():
                data = block.read(offset)
                hasher.update(data)
            if hasher.hexdigest() != digest:
                raise CorruptBlock(f"block file of {digest} holds other bytes")
        except (OSError, CorruptBlock):
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        if size <= chunk:
            block._only = data  # sent as read: no second read of a small block
        return block

    def offsets(self) -> range:
        """Where each chunk starts (an empty block has one chunk, of no bytes)."""
        return range(0, max(self.size, 1), self.chunk)

    def read(self, offset: int) -> bytes:
        """The chunk at ``offset`` (one of :meth:`offsets`); it may block on the disk.

        Raises:
            CorruptBlock: the file is cut short, or a segment fails authentication.
            OSError: the read failed.
        """
        if self._only is not None:
            return self._only
        length = min(self.chunk, self.size - offset)
        if self._key is None:
            data = os.pread(self.fd, length, offset)
        else:
            if self.size == 0:
                start, nbytes, first = HEADER_BYTES, TAG_BYTES, 0
            else:
                start, nbytes, first = BlockCipher.span(self.size, offset, length)
            raw = os.pread(self.fd, nbytes, start)
            data = bytes(self._key.open_span(raw, first, self.size))
        if len(data) != length:
            raise CorruptBlock(f"block file of {self.digest} is cut short")
        return data

    def close(self) -> None:
        """Close the file (again: nothing)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self._only = None

    def __enter__(self) -> BlockFile:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()
