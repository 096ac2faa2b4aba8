"""The block store: block files on disk plus their LMDB index (daemon side only).

Writes are transactional per block: bytes go to a temporary file in the block's
directory and are renamed into place, so a reader (the mount) never sees a partial
block. The index maps each digest to its size and a recency tick, so the eviction
order survives a restart. The daemon is the index's only writer.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import lmdb

from spoke.cache.staging import DirectWrites, Staged, write_block_file
from spoke.disk.encryption import BlockCipher, CorruptBlock
from spoke.disk.layout import TMP_PREFIX, CacheLayout, block_digest, is_digest

Received = bytes | Staged
"""A verified block as the cache takes it: its bytes, or its staged file."""

_ENTRY = struct.Struct(">QQ")  # size (bytes), recency tick
MAP_SIZE = 1 << 36  # 64 GiB of address space for the index; LMDB files grow sparsely


@dataclass(frozen=True)
class StoredBlock:
    """One block in the index: digest, size in bytes, recency tick (higher is newer)."""

    digest: str
    size: int
    tick: int


class BlockStore:
    """Block files under ``CACHE_DIR/blocks`` and their index in ``CACHE_DIR/index``.

    Args:
        layout: the cache directory's layout.
        env: an open LMDB environment shared with other daemon components.
        cipher: seals every block file written and opens every one read (encryption at
            rest, :mod:`spoke.disk.encryption`); None stores blocks as they are.
    """

    def __init__(
        self, layout: CacheLayout, env: lmdb.Environment, cipher: BlockCipher | None = None
    ) -> None:
        self.layout = layout
        self.cipher = cipher
        self._env = env
        self._db = env.open_db(b"blocks")
        self._direct = DirectWrites()
        layout.blocks_dir.mkdir(parents=True, exist_ok=True)

    def recover(self) -> list[StoredBlock]:
        """Bring index and files into agreement after a (possibly unclean) stop.

        Deletes stray temporary files, drops index entries whose file is gone or has another
        size than indexed (torn by a power loss: the rename reached the disk, not all the
        bytes; or written before encryption was turned on), and indexes block files the
        index lacks (a crash between rename and index write) once their bytes match their
        digest.

        Returns:
            Every cached block, oldest tick first.
        """
        on_disk: dict[str, int] = {}
        for sub in self.layout.blocks_dir.iterdir():
            if not sub.is_dir():
                continue
            for f in sub.iterdir():
                if f.name.startswith(TMP_PREFIX):
                    f.unlink(missing_ok=True)
                elif is_digest(f.name):
                    on_disk[f.name] = f.stat().st_size
        blocks: list[StoredBlock] = []
        with self._env.begin(write=True, db=self._db) as txn:
            for key, value in list(txn.cursor()):
                digest = key.decode()
                size, tick = _ENTRY.unpack(value)
                found = on_disk.pop(digest, None)
                if found == self._file_size(size):
                    blocks.append(StoredBlock(digest, size, tick))
                    continue
                txn.delete(key)
                if found is not None:
                    self.layout.block_path(digest).unlink(missing_ok=True)
            for digest, file_size in on_disk.items():
                if not self.verify(digest):
                    self.layout.block_path(digest).unlink(missing_ok=True)
                    continue
                size = self.cipher.plain_size(file_size) if self.cipher else file_size
                txn.put(digest.encode(), _ENTRY.pack(size, 0))
                blocks.append(StoredBlock(digest, size, 0))
        blocks.sort(key=lambda b: b.tick)
        return blocks

    def write(self, digest: str, data: Received, tick: int) -> None:
        """Store a verified block atomically and index it.

        Raises:
            OSError: the cache filesystem refused the write (e.g. ENOSPC); nothing is left behind.
        """
        error = self.write_many([(digest, data, tick)])[0]
        if error is not None:
            raise error

    def stage(self, digest: str, data: memoryview, direct: bool) -> Staged:
        """Write a verified block to its temporary file, for admission later
        (:mod:`spoke.cache.staging`); safe from any thread (no index access).

        Args:
            digest: The block's digest (its bytes were checked against it).
            data: Its bytes, starting on a page boundary (an ``mmap``) when ``direct``.
            direct: Write it with ``O_DIRECT`` (a block fetched ahead of any reader).

        Raises:
            OSError: the write failed (e.g. ENOSPC); nothing is left behind.
        """
        path = str(self.layout.block_path(digest))
        tmp = f"{path[: -len(digest) - 1]}/{TMP_PREFIX}{digest}"
        sealed = self.cipher is not None
        payload: bytes | memoryview = data
        if self.cipher is not None:
            payload, direct = self.cipher.seal(digest, data), False
        try:
            try:
                write_block_file(tmp, payload, self._direct if direct else None)
            except FileNotFoundError:
                os.makedirs(os.path.dirname(tmp), exist_ok=True)
                write_block_file(tmp, payload, self._direct if direct else None)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return Staged(digest, len(data), tmp, sealed)

    def read_staged(self, staged: Staged) -> bytes:
        """A staged block's bytes (opened when sealed), for a block the cache did not
        admit but whose readers wait (stream-through).

        Raises:
            OSError: the file cannot be read.
            CorruptBlock: a sealed file fails authentication.
        """
        with open(staged.path, "rb") as file:
            data = file.read()
        return self.cipher.open(staged.digest, data) if staged.sealed and self.cipher else data

    def write_many(self, blocks: Sequence[tuple[str, Received, int]]) -> list[OSError | None]:
        """Store several verified ``(digest, bytes or staged file, tick)`` blocks, indexing
        them in one transaction (one index commit, hence one disk flush, for the lot); a
        staged block's file is renamed into place.

        Returns:
            Per block, None when it was stored, or the OSError that refused it (e.g.
            ENOSPC; nothing of that block is left behind, the others are unaffected).

        Raises:
            lmdb.Error: the index commit failed; the block files written stay and
                :meth:`recover` indexes them at the next start.
        """
        errors: list[OSError | None] = []
        for digest, data, _tick in blocks:
            try:
                if isinstance(data, Staged):
                    os.replace(data.path, str(self.layout.block_path(digest)))
                else:
                    self._write_file(digest, data)
            except OSError as err:
                errors.append(err)
            else:
                errors.append(None)
        if any(error is None for error in errors):
            with self._env.begin(write=True, db=self._db) as txn:
                for (digest, data, tick), error in zip(blocks, errors, strict=True):
                    if error is None:
                        txn.put(digest.encode(), _ENTRY.pack(len(data), tick))
        return errors

    def _write_file(self, digest: str, data: bytes) -> None:
        """Write ``data`` to a temporary file beside the block's path and rename it there.

        Plain ``os`` calls on strings: this runs once per block, and pathlib and mkstemp
        cost more than the write of a small block. The temporary name is the digest's
        (single-flight fetching never writes one digest twice at once); a leftover from
        an interrupted write is replaced.

        Raises:
            OSError: the write failed; no temporary file is left behind.
        """
        path = str(self.layout.block_path(digest))
        folder = path[: -len(digest) - 1]
        tmp = f"{folder}/{TMP_PREFIX}{digest}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        if self.cipher is not None:
            data = self.cipher.seal(digest, data)
        try:
            fd = os.open(tmp, flags, 0o600)
        except FileNotFoundError:
            os.makedirs(folder, exist_ok=True)
            fd = os.open(tmp, flags, 0o600)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def delete(self, digest: str) -> None:
        """Remove a block's file and index entry (missing ones are ignored)."""
        self.layout.block_path(digest).unlink(missing_ok=True)
        with self._env.begin(write=True, db=self._db) as txn:
            txn.delete(digest.encode())

    def delete_many(self, digests: list[str]) -> None:
        """Remove several blocks' files and index entries in one index transaction."""
        for digest in digests:
            self.layout.block_path(digest).unlink(missing_ok=True)
        with self._env.begin(write=True, db=self._db) as txn:
            for digest in digests:
                txn.delete(digest.encode())

    def _file_size(self, size: int) -> int:
        """Bytes on disk of a ``size``-byte block's file."""
        return self.cipher.sealed_size(size) if self.cipher is not None else size

    def read(self, digest: str) -> bytes | None:
        """A cached block's bytes, opened (decrypted and authenticated) and checked against
        its digest; None if absent, unreadable, or not that block's bytes (it may block on
        the disk: call it from a worker thread)."""
        try:
            data = self.layout.block_path(digest).read_bytes()
        except OSError:
            return None
        if self.cipher is not None:
            try:
                data = self.cipher.open(digest, data)
            except CorruptBlock:
                return None
        return data if block_digest(data) == digest else None

    def verify(self, digest: str) -> bool:
        """Re-read a cached block and check it against its digest (False if absent, bad or
        unreadable; with encryption, also if it fails authentication)."""
        return self.read(digest) is not None

    def touch(self, ticks: dict[str, int]) -> None:
        """Record new recency ticks for indexed blocks, in one transaction."""
        with self._env.begin(write=True, db=self._db) as txn:
            for digest, tick in ticks.items():
                key = digest.encode()
                value = txn.get(key)
                if value is not None:
                    size, _ = _ENTRY.unpack(value)
                    txn.put(key, _ENTRY.pack(size, tick))

    def __iter__(self) -> Iterator[StoredBlock]:
        with self._env.begin(db=self._db) as txn:
            for key, value in txn.cursor():
                size, tick = _ENTRY.unpack(value)
                yield StoredBlock(key.decode(), size, tick)


def open_index(layout: CacheLayout) -> lmdb.Environment:
    """Open (creating) the daemon's LMDB environment under ``CACHE_DIR/index``."""
    layout.index_dir.mkdir(parents=True, exist_ok=True)
    return lmdb.open(str(layout.index_dir), map_size=MAP_SIZE, max_dbs=8, subdir=True)
