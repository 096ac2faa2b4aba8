"""Encryption at rest of block files (``--encryption-key-file``): AES-256-GCM, one key per
spoke, shared by the daemon (which writes block files) and the mount (which reads them).

A sealed block file is ``MAGIC (4) || nonce (12) || ciphertext || tag (16)``: a fresh
random 96-bit nonce per file (NIST SP 800-38D, section 8.2.2: random nonces stay safe up
to 2^32 messages per key), and the block's digest as associated data, so a file cannot be
swapped for another block's file, nor be renamed to another digest, without failing
authentication. GCM authenticates the whole file: a reader decrypts all of it before it
uses a byte (``CorruptBlock`` otherwise, which the readers treat like a digest mismatch:
dropped and refetched, never served).

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
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from spoke.layout import CacheLayout

KEY_BYTES = 32
"""AES-256."""
NONCE_BYTES = 12
TAG_BYTES = 16
MAGIC = b"SEB1"
"""Strata encrypted block, format 1 (part of the associated data too)."""
OVERHEAD = len(MAGIC) + NONCE_BYTES + TAG_BYTES
"""Bytes a sealed block file has beyond the block itself."""
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


class BlockCipher:
    """Seal and open block files with one AES-256-GCM key.

    Args:
        key: 32 bytes.

    Raises:
        EncryptionError: the key is not 32 bytes.
    """

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise EncryptionError(f"an encryption key has {KEY_BYTES} bytes, not {len(key)}")
        self._aead = AESGCM(key)
        self.check_value = hmac.new(key, CHECK_LABEL, hashlib.sha256).hexdigest()
        """Identifies the key (HMAC-SHA256 of a fixed label): safe to store beside the data."""

    @classmethod
    def from_file(cls, path: Path) -> BlockCipher:
        """The cipher of the key in ``path`` (see :func:`load_key`; raises EncryptionError)."""
        return cls(load_key(path))

    @staticmethod
    def sealed_size(size: int) -> int:
        """Bytes of the file that holds a ``size``-byte block."""
        return size + OVERHEAD

    @staticmethod
    def plain_size(file_size: int) -> int:
        """Bytes of the block a ``file_size``-byte sealed file holds (-1: too short)."""
        return file_size - OVERHEAD if file_size >= OVERHEAD else -1

    def seal(self, digest: str, data: bytes | bytearray | memoryview) -> bytes:
        """The file contents that hold block ``digest`` (a fresh nonce each call)."""
        nonce = os.urandom(NONCE_BYTES)
        return MAGIC + nonce + self._aead.encrypt(nonce, bytes(data), MAGIC + digest.encode())

    def open(self, digest: str, sealed: bytes | bytearray | memoryview) -> bytes:
        """The block in a sealed file's contents, authenticated.

        Raises:
            CorruptBlock: not a sealed file of block ``digest`` under this key.
        """
        view = memoryview(sealed)
        if len(view) < OVERHEAD or bytes(view[: len(MAGIC)]) != MAGIC:
            raise CorruptBlock(f"block file of {digest} is not a sealed block")
        nonce = bytes(view[len(MAGIC) : len(MAGIC) + NONCE_BYTES])
        try:
            return self._aead.decrypt(
                nonce, bytes(view[len(MAGIC) + NONCE_BYTES :]), MAGIC + digest.encode()
            )
        except InvalidTag:
            raise CorruptBlock(f"block file of {digest} failed authentication") from None


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
            tmp = path.with_name(path.name + ".tmp")
            body = {"cipher": CIPHER_NAME, "key_check": cipher.check_value}
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(json.dumps(body) + "\n")
            tmp.replace(path)
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
