"""Encryption at rest of block files (``--encryption-key-file``): AES-256-GCM, one key per
spoke, shared by the daemon (which writes block files) and the mount (which reads them).

A sealed block file is a header (``MAGIC``, a random 128-bit salt) and the block in
segments of 32 KiB, each sealed on its own (:class:`BlockCipher`) under a key of that
file alone (HKDF-SHA256 of the spoke's key, the salt and the digest; RFC 5869), with the
segment's index as nonce and the digest and a last-segment flag as associated data: a
file cannot be swapped for another block's file, renamed to another digest, reordered
or cut without failing authentication, a reader of a small range decrypts only the
segments it covers, and no nonce is ever used twice under one key (a fresh key per file
write; salts collide with probability ~n²/2^129 after n writes). A segment that fails is
``CorruptBlock``, which the readers treat like a digest mismatch: dropped and refetched,
never served.

The key file holds 32 bytes, raw or as 64 hex characters (``strata-spoke encryption-key
FILE`` writes one), and must be readable by its owner only. The cache directory records
which key wrote it (``CACHE_DIR/encryption.check``, an HMAC-SHA256 of a fixed label under
the key, never the key): a cache written with one key and opened with none or another is
refused at start, so the spoke never serves bytes it cannot authenticate.

What this protects: block files on a disk taken out of the node (a stolen or discarded
disk, a backup of the cache directory) read as random bytes without the key. What it
does not: anyone who is root on a running node (or the spoke's user) can read the key
file, the mount, or the processes' memory.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
import struct
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from spoke.disk.layout import CacheLayout
from strata_local.atomic import write_atomic

KEY_BYTES = 32
"""AES-256."""
SALT_BYTES = 16
"""Random per file write: the file's own key is derived from it."""
TAG_BYTES = 16
MAGIC = b"SEB2"
"""Strata encrypted block, format 2 (segmented; part of the associated data too)."""
HEADER_BYTES = len(MAGIC) + SALT_BYTES
SEGMENT_BYTES = 32 * 1024
"""Plaintext bytes per sealed segment: a read decrypts only the segments it covers."""
OVERHEAD = HEADER_BYTES + TAG_BYTES
"""Bytes a sealed file of a block of at most one segment has beyond the block itself."""
_INDEX = struct.Struct(">I")
CHECK_LABEL = b"strata-spoke cache key check v1"
CIPHER_NAME = "AES-256-GCM"


class EncryptionError(ValueError):
    """A key file or the cache directory's key record is unusable (one-line message)."""


class CorruptBlock(ValueError):
    """A sealed block file failed authentication: damaged, truncated, swapped or foreign."""


def load_key(path: Path) -> bytes:
    """The 32-byte key in ``path`` (raw, or 64 hex characters and an optional newline).

    Raises:
        EncryptionError: the file is missing, unreadable, readable by group or others,
            or does not hold exactly 32 bytes of key.
    """
    what = f"--encryption-key-file {path}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as err:
        raise EncryptionError(f"{what}: {err.strerror or err}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise EncryptionError(f"{what}: not a regular file")
        if st.st_mode & 0o077:
            raise EncryptionError(
                f"{what}: readable by group or others (mode {stat.S_IMODE(st.st_mode):04o}); "
                "chmod 600 it"
            )
        raw = os.read(fd, 4 * KEY_BYTES)
    except OSError as err:
        raise EncryptionError(f"{what}: {err.strerror or err}") from None
    finally:
        os.close(fd)
    if len(raw) == KEY_BYTES:
        return raw
    text = raw.strip()
    if len(text) == 2 * KEY_BYTES:
        try:
            return bytes.fromhex(text.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            pass
    raise EncryptionError(
        f"{what}: expected a {KEY_BYTES}-byte key (raw, or {2 * KEY_BYTES} hex characters), "
        f"found {len(raw)} bytes; make one with: strata-spoke encryption-key FILE"
    )


def write_key(path: Path) -> None:
    """Write a fresh random key to ``path`` as hex (mode 0600, never over an existing file).

    Raises:
        FileExistsError: ``path`` exists.
        OSError: it could not be written.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_bytes(KEY_BYTES).hex() + "\n")


def _segments(size: int) -> int:
    """Segments of a ``size``-byte block (an empty block has one, of no bytes)."""
    return max(1, -(-size // SEGMENT_BYTES))


class FileKey:
    """The key of one sealed block file (derived by :meth:`BlockCipher.file_key`)."""

    def __init__(self, digest: str, aead: AESGCM) -> None:
        self.digest = digest
        self._aead = aead

    def seal_segment(self, index: int, chunk: bytes | memoryview, last: bool) -> bytes:
        """Segment ``index`` of the file: ciphertext and tag."""
        return self._aead.encrypt(_nonce(index), bytes(chunk), _aad(self.digest, last))

    def open_span(self, raw: bytes | bytearray | memoryview, first: int, size: int) -> bytearray:
        """The plaintext of consecutive sealed segments ``raw``, the first at index
        ``first``, of a ``size``-byte block (as :meth:`BlockCipher.span` located them),
        decrypted into one buffer (no copy per segment).

        Raises:
            CorruptBlock: a segment fails authentication, or ``raw`` is cut short.
        """
        view = memoryview(raw)
        count = _segments(size)
        segments = -(-len(view) // (SEGMENT_BYTES + TAG_BYTES))
        out = bytearray(max(0, len(view) - TAG_BYTES * segments))
        target = memoryview(out)
        index, pos, done = first, 0, 0
        while pos < len(view):
            length = min(SEGMENT_BYTES, size - index * SEGMENT_BYTES)
            end = pos + length + TAG_BYTES
            if index >= count or length < 0 or end > len(view) or done + length > len(out):
                raise CorruptBlock(f"block file of {self.digest} is cut short")
            try:
                self._aead.decrypt_into(
                    _nonce(index),
                    view[pos:end],
                    _aad(self.digest, index == count - 1),
                    target[done : done + length],
                )
            except InvalidTag:
                raise CorruptBlock(f"block file of {self.digest} failed authentication") from None
            index, pos, done = index + 1, end, done + length
        if done != len(out):
            raise CorruptBlock(f"block file of {self.digest} is cut short")
        return out


class BlockCipher:
    """Seal and open block files with the spoke's AES-256-GCM key.

    A sealed file is ``MAGIC | salt (16 random bytes) | segment 0 | segment 1 | ...``,
    each segment the AES-GCM ciphertext and tag of up to :data:`SEGMENT_BYTES` of the
    block, under the file's key HKDF-SHA256(key, salt, info = ``MAGIC | digest``), with
    nonce = the segment's index and associated data ``MAGIC | digest | last u8`` (the
    STREAM construction: Hoang, Reyhanitabar, Rogaway and Vizár, "Online
    Authenticated-Encryption and its Nonce-Reuse Misuse-Resistance", CRYPTO 2015; a
    derived key per file as in Tink's AES-GCM-HKDF streaming AEAD). So a segment opens
    only at its own index of a file of its own digest under this key, and a file cut at a
    segment boundary fails (its new last segment was not sealed as last).

    Args:
        key: 32 bytes.

    Raises:
        EncryptionError: the key is not 32 bytes.
    """

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise EncryptionError(f"an encryption key has {KEY_BYTES} bytes, not {len(key)}")
        self._key = key
        self.check_value = hmac.new(key, CHECK_LABEL, hashlib.sha256).hexdigest()
        """Identifies the key (HMAC-SHA256 of a fixed label): safe to store beside the data."""

    @classmethod
    def from_file(cls, path: Path) -> BlockCipher:
        """The cipher of the key in ``path`` (see :func:`load_key`; raises EncryptionError)."""
        return cls(load_key(path))

    @staticmethod
    def sealed_size(size: int) -> int:
        """Bytes of the file that holds a ``size``-byte block."""
        return HEADER_BYTES + size + TAG_BYTES * _segments(size)

    @staticmethod
    def plain_size(file_size: int) -> int:
        """Bytes of the block a ``file_size``-byte sealed file holds (-1: no such size)."""
        rest = file_size - HEADER_BYTES
        if rest < TAG_BYTES:
            return -1
        size = rest - TAG_BYTES * -(-rest // (SEGMENT_BYTES + TAG_BYTES))
        return size if BlockCipher.sealed_size(size) == file_size else -1

    def _derive(self, digest: str, salt: bytes) -> FileKey:
        info = MAGIC + digest.encode()
        key = HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=salt, info=info)
        return FileKey(digest, AESGCM(key.derive(self._key)))

    def file_key(self, digest: str, header: bytes | bytearray | memoryview) -> FileKey:
        """The key of the sealed file of ``digest`` whose first :data:`HEADER_BYTES` (or
        more) are ``header``.

        Raises:
            CorruptBlock: the header is not a sealed block's.
        """
        if len(header) < HEADER_BYTES or bytes(header[: len(MAGIC)]) != MAGIC:
            raise CorruptBlock(f"block file of {digest} is not a sealed block")
        return self._derive(digest, bytes(header[len(MAGIC) : HEADER_BYTES]))

    def seal(self, digest: str, data: bytes | bytearray | memoryview) -> bytes:
        """The file contents that hold block ``digest`` (a fresh salt, hence key, each call)."""
        salt = os.urandom(SALT_BYTES)
        key = self._derive(digest, salt)
        view = memoryview(data)
        count = _segments(len(view))
        parts = [MAGIC, salt]
        for index in range(count):
            chunk = view[index * SEGMENT_BYTES : (index + 1) * SEGMENT_BYTES]
            parts.append(key.seal_segment(index, chunk, index == count - 1))
        return b"".join(parts)

    def open(self, digest: str, sealed: bytes | bytearray | memoryview) -> bytes:
        """The whole block in a sealed file's contents, every segment authenticated.

        Raises:
            CorruptBlock: not a sealed file of block ``digest`` under this key.
        """
        view = memoryview(sealed)
        key = self.file_key(digest, view[:HEADER_BYTES])
        size = self.plain_size(len(view))
        if size < 0:
            raise CorruptBlock(f"block file of {digest} has no sealed size ({len(view)} bytes)")
        return bytes(key.open_span(view[HEADER_BYTES:], 0, size))

    @staticmethod
    def span(size: int, offset: int, length: int) -> tuple[int, int, int]:
        """Where the segments covering ``length`` bytes at ``offset`` of a ``size``-byte
        block lie in its sealed file: ``(file offset, bytes, first segment index)``.

        The range must be within the block (``offset + length <= size``, ``length > 0``).
        """
        first = offset // SEGMENT_BYTES
        last = (offset + length - 1) // SEGMENT_BYTES
        start = HEADER_BYTES + first * (SEGMENT_BYTES + TAG_BYTES)
        end_plain = min((last + 1) * SEGMENT_BYTES, size)
        end = HEADER_BYTES + end_plain + (last + 1) * TAG_BYTES
        return start, end - start, first


def _nonce(index: int) -> bytes:
    return bytes(8) + _INDEX.pack(index)


def _aad(digest: str, last: bool) -> bytes:
    return MAGIC + digest.encode() + (b"\1" if last else b"\0")


def check_file(layout: CacheLayout) -> Path:
    """Where the cache directory records the key that wrote it."""
    return layout.root / "encryption.check"


def check_cache_key(
    layout: CacheLayout, cipher: BlockCipher | None, key_file: Path | None, record: bool
) -> None:
    """Refuse a cache directory written with another key, or with one when none is given.

    Args:
        cipher: this process's key (None: encryption off).
        key_file: its path, for the message.
        record: write the record when the directory has none and a key is given (the
            daemon, before it writes a block; plaintext blocks already there fail their
            size check at recovery and are dropped).

    Raises:
        EncryptionError: the directory was written with another key, or encrypted and no
            key is given, or its record is unreadable.
    """
    path = check_file(layout)
    try:
        recorded = json.loads(path.read_text())["key_check"]
    except FileNotFoundError:
        recorded = None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise EncryptionError(f"cache dir {layout.root}: unreadable {path.name}: {err}") from None
    if recorded is None:
        if cipher is not None and record:
            body = {"cipher": CIPHER_NAME, "key_check": cipher.check_value}
            write_atomic(path, (json.dumps(body) + "\n").encode())
        return
    if cipher is None:
        raise EncryptionError(
            f"cache dir {layout.root} holds encrypted blocks: give the --encryption-key-file "
            "it was written with (or empty the cache dir to run without encryption)"
        )
    if not hmac.compare_digest(str(recorded), cipher.check_value):
        raise EncryptionError(
            f"--encryption-key-file {key_file}: not the key cache dir {layout.root} was "
            "written with (give that key, or empty the cache dir to start over with this one)"
        )
