"""Encryption at rest through a real spoke and mount: identical bytes, nothing readable on
disk, a tampered block file refused and refetched (never served), and a cache dir opened
with no key or another key refused at start with one line."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from deploy.local import LocalStack
from hub.publish.tree import publish
from spoke.disk.encryption import OVERHEAD, TAG_BYTES, BlockCipher, write_key
from spoke.disk.layout import CacheLayout, block_digest
from tests.integration.hub_support import write_tree
from tests.support import requires_fuse

pytestmark = [pytest.mark.fuse, requires_fuse, pytest.mark.timeout(180)]


def _metric(admin: str, name: str, auth: dict[str, str]) -> float:
    text = httpx.get(f"{admin}/metrics", headers=auth, timeout=10).text
    return sum(float(line.split()[1]) for line in text.splitlines() if line.startswith(name + " "))


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "spoke", "run", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


def test_an_encrypted_cache_reads_identically_and_refuses_tampering(tmp_path: Path) -> None:
    files = {
        "small.bin": os.urandom(70_000),
        "big.bin": os.urandom(9 << 20),  # three blocks of 4 MiB, the last one short
        "sub/hot.bin": os.urandom(300_000),
        "sub/empty": b"",
    }
    data = tmp_path / "data"
    publish(data, "ds", write_tree(tmp_path / "src", files))
    key = tmp_path / "cache.key"
    write_key(key)
    cache, mnt = tmp_path / "cache", tmp_path / "mnt"
    layout = CacheLayout(cache)
    with LocalStack() as stack:
        hub = stack.start_hub(data)
        flags = ("--encryption-key-file", str(key), "--miss-deadline", "10")
        admin = stack.start_spoke(hub, cache, mnt, "64MiB", extra=flags, admin_token=True)
        token = (cache / "admin.token").read_text().strip()
        auth = {"Authorization": f"Bearer {token}"}
        root = mnt / "ds" / "v1"
        for name in ("small.bin", "big.bin", "sub/empty"):
            assert (root / name).read_bytes() == files[name]
        # what is on disk is sealed: the right size, no plaintext, opens only with the key
        cipher = BlockCipher.from_file(key)
        small = block_digest(files["small.bin"])
        sealed = layout.block_path(small).read_bytes()
        assert len(sealed) == cipher.sealed_size(70_000) == 70_000 + OVERHEAD + 2 * TAG_BYTES
        assert files["small.bin"][:64] not in sealed
        assert cipher.open(small, sealed) == files["small.bin"]
        first_big = block_digest(files["big.bin"][: 4 << 20])
        assert layout.block_path(first_big).stat().st_size == cipher.sealed_size(4 << 20)

        # prewarmed (not yet read by the mount), then one byte flipped on the cache disk
        reply = httpx.post(
            f"{admin}/v1/prewarm", json={"dataset": "ds", "paths": ["sub/*"]}, headers=auth
        )
        assert reply.status_code == 202, reply.text
        hot = block_digest(files["sub/hot.bin"])
        job = reply.json()
        while job["state"] == "running":
            time.sleep(0.05)
            job = httpx.get(f"{admin}/v1/jobs/{job['id']}", headers=auth, timeout=10).json()
        assert job["state"] == "done", job
        damaged = bytearray(layout.block_path(hot).read_bytes())
        damaged[len(damaged) // 2] ^= 0x10
        layout.block_path(hot).write_bytes(bytes(damaged))
        before = _metric(admin, "strata_spoke_corrupt_blocks_total", auth)
        assert (root / "sub" / "hot.bin").read_bytes() == files["sub/hot.bin"]
        assert _metric(admin, "strata_spoke_corrupt_blocks_total", auth) == before + 1
        assert cipher.open(hot, layout.block_path(hot).read_bytes()) == files["sub/hot.bin"]
        stack.stop_spoke()

    base = ["--hub", hub, "--cache-dir", str(cache), "--cache-size", "64MiB"]
    base += ["--mount", str(mnt), "--admin", "127.0.0.1:0", "--no-admin-token"]
    other = tmp_path / "other.key"
    write_key(other)
    wrong = _run([*base, "--encryption-key-file", str(other)])
    assert wrong.returncode == 1
    assert wrong.stderr.strip().splitlines() == [
        f"strata-spoke: error: --encryption-key-file {other}: not the key cache dir "
        f"{cache.resolve()} was written with (give that key, or empty the cache dir to start "
        "over with this one)"
    ]
    none = _run(base)
    assert none.returncode == 1
    assert "holds encrypted blocks: give the --encryption-key-file" in none.stderr
    key.chmod(0o644)
    open_key = _run([*base, "--encryption-key-file", str(key)])
    assert open_key.returncode == 2
    assert "readable by group or others (mode 0644); chmod 600 it" in open_key.stderr
    assert not (cache / "admin.url").exists()  # nothing started
