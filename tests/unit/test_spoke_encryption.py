"""Encryption at rest: key files, sealed block files, the cache dir's key record, and the
daemon's store and the mount's block files reading them back."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from fusemount.blockfiles import BlockFiles, CorruptBlockError
from spoke.cache.store import BlockStore, open_index
from spoke.disk.encryption import (
    HEADER_BYTES,
    KEY_BYTES,
    OVERHEAD,
    SEGMENT_BYTES,
    TAG_BYTES,
    BlockCipher,
    CorruptBlock,
    EncryptionError,
    check_cache_key,
    check_file,
    load_key,
    write_key,
)
from spoke.disk.layout import CacheLayout, block_digest


def _key(tmp_path: Path, name: str = "key") -> Path:
    path = tmp_path / name
    write_key(path)
    return path


def test_key_files_raw_or_hex_owner_only(tmp_path: Path) -> None:
    hexed = _key(tmp_path)
    assert oct(hexed.stat().st_mode & 0o777) == "0o600"
    assert len(load_key(hexed)) == KEY_BYTES
    raw = tmp_path / "raw"
    raw.write_bytes(os.urandom(KEY_BYTES))
    raw.chmod(0o400)
    assert load_key(raw) == raw.read_bytes()
    with pytest.raises(FileExistsError):
        write_key(hexed)  # a key is never overwritten


@pytest.mark.parametrize(
    ("content", "mode", "message"),
    [
        (None, 0o600, "No such file"),
        (b"00" * 31 + b"\n", 0o600, "expected a 32-byte key"),
        (b"zz" * 32, 0o600, "expected a 32-byte key"),
        (bytes(range(200, 233)), 0o600, "expected a 32-byte key"),
        (bytes(range(100, 100 + KEY_BYTES)), 0o640, "readable by group or others (mode 0640)"),
        (bytes(range(1, 1 + KEY_BYTES)), 0o604, "chmod 600"),
    ],
    ids=["missing", "hex-31", "not-hex", "33-bytes", "mode-0640", "mode-0604"],
)
def test_bad_key_files_say_why(
    tmp_path: Path, content: bytes | None, mode: int, message: str
) -> None:
    path = tmp_path / "key"
    if content is not None:
        path.write_bytes(content)
        path.chmod(mode)
    with pytest.raises(EncryptionError, match=re.escape(message)):
        load_key(path)


def test_a_sealed_block_opens_only_as_itself_under_its_key(tmp_path: Path) -> None:
    cipher = BlockCipher.from_file(_key(tmp_path))
    data = os.urandom(5000)
    digest = block_digest(data)
    sealed = cipher.seal(digest, data)
    assert len(sealed) == cipher.sealed_size(len(data)) == len(data) + OVERHEAD
    assert data not in sealed
    assert cipher.seal(digest, data) != sealed  # a fresh nonce each time
    assert cipher.open(digest, sealed) == data
    other = block_digest(b"another block")
    with pytest.raises(CorruptBlock):  # the digest is associated data: no swapping files
        cipher.open(other, sealed)
    flipped = bytearray(sealed)
    flipped[100] ^= 1
    with pytest.raises(CorruptBlock):
        cipher.open(digest, bytes(flipped))
    with pytest.raises(CorruptBlock):
        BlockCipher.from_file(_key(tmp_path, "other")).open(digest, sealed)
    with pytest.raises(CorruptBlock):
        cipher.open(digest, data)  # a plaintext file
    assert cipher.open(block_digest(b""), cipher.seal(block_digest(b""), b"")) == b""


def test_the_cache_dir_remembers_its_key(tmp_path: Path) -> None:
    layout = CacheLayout(tmp_path / "cache")
    layout.root.mkdir()
    key, other = _key(tmp_path), _key(tmp_path, "other")
    cipher = BlockCipher.from_file(key)
    check_cache_key(layout, None, None, record=True)  # plain and unrecorded: fine
    check_cache_key(layout, cipher, key, record=False)
    assert not check_file(layout).exists()
    check_cache_key(layout, cipher, key, record=True)
    assert key.read_text().strip() not in check_file(layout).read_text()  # never the key
    assert oct(check_file(layout).stat().st_mode & 0o777) == "0o600"
    check_cache_key(layout, BlockCipher.from_file(key), key, record=True)  # same key again
    with pytest.raises(EncryptionError, match="holds encrypted blocks"):
        check_cache_key(layout, None, None, record=True)
    with pytest.raises(EncryptionError, match=f"{other}: not the key cache dir"):
        check_cache_key(layout, BlockCipher.from_file(other), other, record=True)
    check_file(layout).write_text("garbage")
    with pytest.raises(EncryptionError, match=r"unreadable encryption\.check"):
        check_cache_key(layout, cipher, key, record=True)


def test_the_store_seals_what_it_writes_and_opens_what_it_reads(tmp_path: Path) -> None:
    layout = CacheLayout(tmp_path)
    cipher = BlockCipher.from_file(_key(tmp_path))
    env = open_index(layout)
    store = BlockStore(layout, env, cipher)
    blocks = {block_digest(d): d for d in (os.urandom(3000), os.urandom(10), b"")}
    for digest, data in blocks.items():
        store.write(digest, data, tick=1)
        on_disk = layout.block_path(digest).read_bytes()
        assert len(on_disk) == len(data) + OVERHEAD
        assert data == b"" or data not in on_disk
        assert store.read(digest) == data
        assert store.verify(digest)
    victim = next(d for d, v in blocks.items() if len(v) == 3000)
    damaged = bytearray(layout.block_path(victim).read_bytes())
    damaged[-1] ^= 0x80
    layout.block_path(victim).write_bytes(bytes(damaged))
    assert store.read(victim) is None
    assert not store.verify(victim)
    env.close()
    # recovery keeps sealed blocks of the indexed size, indexes an unindexed sealed one
    # by its plaintext size, and drops plaintext blocks left from before encryption
    plain = b"written before encryption was on"
    digest_plain = block_digest(plain)
    layout.block_path(digest_plain).parent.mkdir(parents=True, exist_ok=True)
    layout.block_path(digest_plain).write_bytes(plain)
    loose = os.urandom(700)
    digest_loose = block_digest(loose)
    layout.block_path(digest_loose).parent.mkdir(parents=True, exist_ok=True)
    layout.block_path(digest_loose).write_bytes(cipher.seal(digest_loose, loose))
    env = open_index(layout)
    store = BlockStore(layout, env, cipher)
    recovered = {b.digest: b.size for b in store.recover()}
    assert recovered[digest_loose] == 700
    assert digest_plain not in recovered
    assert not layout.block_path(digest_plain).exists()
    assert all(recovered[d] == len(v) for d, v in blocks.items() if d != victim)
    # a store without the key sees sealed files as bad blocks, never as data
    assert BlockStore(layout, env).read(digest_loose) is None
    env.close()


def test_segments_open_alone_and_only_in_place(tmp_path: Path) -> None:
    cipher = BlockCipher.from_file(_key(tmp_path))
    for size in (0, 1, SEGMENT_BYTES - 1, SEGMENT_BYTES, SEGMENT_BYTES + 1, 3 * SEGMENT_BYTES):
        data = os.urandom(size)
        digest = block_digest(data)
        sealed = cipher.seal(digest, data)
        assert len(sealed) == cipher.sealed_size(size)
        assert cipher.plain_size(len(sealed)) == size
        assert cipher.open(digest, sealed) == data
    key = cipher.file_key(digest, sealed[:HEADER_BYTES])
    start, length, first = cipher.span(len(data), SEGMENT_BYTES + 5, 10)  # within segment 1
    assert first == 1 and length == SEGMENT_BYTES + TAG_BYTES
    seg = sealed[start : start + length]
    assert key.open_span(seg, 1, len(data))[5:15] == data[SEGMENT_BYTES + 5 :][:10]
    with pytest.raises(CorruptBlock):  # a segment moved to another index
        key.open_span(seg, 2, len(data))
    again = cipher.seal(digest, data)  # the same block sealed again: another salt and key
    with pytest.raises(CorruptBlock):
        cipher.file_key(digest, again[:HEADER_BYTES]).open_span(seg, 1, len(data))
    with pytest.raises(CorruptBlock):  # the same salt under another digest
        cipher.file_key(block_digest(b"x"), sealed[:HEADER_BYTES]).open_span(seg, 1, len(data))
    cut = sealed[: HEADER_BYTES + 2 * (SEGMENT_BYTES + TAG_BYTES)]  # two whole segments of 3
    with pytest.raises(CorruptBlock):  # the new last segment was not sealed as last
        cipher.open(digest, cut)
    assert cipher.plain_size(HEADER_BYTES + 5) == -1


def test_the_mount_reads_sealed_blocks_and_refuses_tampered_ones(tmp_path: Path) -> None:
    layout = CacheLayout(tmp_path)
    cipher = BlockCipher.from_file(_key(tmp_path))
    store = BlockStore(layout, open_index(layout), cipher)
    data = os.urandom(200_000)
    digest = block_digest(data)
    store.write(digest, data, tick=1)
    files = BlockFiles(layout, cipher=cipher)
    assert files.encrypted and not BlockFiles(layout).encrypted
    assert files.read(digest, 0, 0) == b""
    assert files.read(digest, 1000, 5000) == data[1000:6000]
    assert files.read(digest, 60_000, 80_000) == data[60_000:140_000]  # three segments
    assert files.read(digest, 199_990, 100) == data[199_990:]
    assert files.read(digest, 200_000, 5) == b""
    assert files.verifications == 3  # one authenticated span per non-empty read
    files.recheck_after = 0.0
    fast = files.read_cached(digest, 4096, 4096)  # written just now: in the page cache
    assert fast is not None and bytes(fast) == data[4096:8192]
    # a byte flipped in segment 2 (a new identity): that segment is refused, never served
    sealed = bytearray(layout.block_path(digest).read_bytes())
    sealed[HEADER_BYTES + 2 * (SEGMENT_BYTES + TAG_BYTES) + 100] ^= 0x01
    layout.block_path(digest).write_bytes(bytes(sealed))
    os.utime(layout.block_path(digest), ns=(1, 1))
    assert files.read_cached(digest, 2 * SEGMENT_BYTES, 10) is None
    with pytest.raises(CorruptBlockError):
        files.read(digest, 2 * SEGMENT_BYTES, 10)
    with pytest.raises(CorruptBlockError):  # and again: nothing was kept of it
        files.read(digest, 2 * SEGMENT_BYTES + 50, 100)
    # another block's sealed file renamed to this digest is refused too
    other = os.urandom(1000)
    layout.block_path(digest).write_bytes(cipher.seal(block_digest(other), other))
    with pytest.raises(CorruptBlockError):
        files.read(digest, 0, 10)
    layout.block_path(digest).write_bytes(data)  # a plaintext file: not a sealed block
    with pytest.raises(CorruptBlockError):
        files.read(digest, 0, 10)
    store.write(digest, data, tick=2)  # the daemon's refetch
    assert files.read(digest, 7, 3) == data[7:10]
    layout.block_path(digest).unlink()  # evicted: the sweep closes it
    assert files.sweep() == 1


def test_settings_take_the_key_from_a_variable_and_pass_it_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pydantic import ValidationError

    from spoke.run.settings import SpokeSettings
    from spoke.run.supervisor import Supervisor

    key = _key(tmp_path)
    monkeypatch.setenv("STRATA_SPOKE_ENCRYPTION_KEY_FILE", str(key))
    (tmp_path / "mnt").mkdir()
    settings = SpokeSettings(
        hub="127.0.0.1:1", cache_dir=tmp_path / "c", cache_size="1MiB", mount=tmp_path / "mnt"
    )
    assert settings.block_cipher() is not None
    supervisor = Supervisor(settings)  # what it hands the daemon and the mount
    assert supervisor.settings.encryption_key_file == key.resolve()
    assert supervisor.mount_settings().encryption_key_file == key.resolve()
    key.chmod(0o644)
    with pytest.raises(ValidationError, match="readable by group or others"):
        SpokeSettings(hub="127.0.0.1:1", cache_dir=tmp_path / "c", cache_size="1MiB")
