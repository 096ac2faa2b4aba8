"""Invalidation through a real mount: a moved tag shows within 2 s, an open v1 keeps reading
v1, and a revoked version disappears (ENOENT for new opens, EIO for open files) with its
unshared blocks purged."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from deploy.local import LocalStack
from tests.support import publish, requires_fuse

pytestmark = [pytest.mark.fuse, requires_fuse]

BLOCK = 65_536


def _within(seconds: float, cond: Callable[[], bool]) -> float:
    started = time.monotonic()
    while not cond():
        if time.monotonic() - started > seconds:
            raise AssertionError(f"not within {seconds} s")
        time.sleep(0.05)
    return time.monotonic() - started


def _hub(data_dir: Path, *args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "hub", *args, "--data-dir", str(data_dir)],
        check=True,
        capture_output=True,
    )


def test_tag_move_and_revocation(tmp_path: Path) -> None:
    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    for src, seed in ((v1, b"one"), (v2, b"two")):
        src.mkdir()
        (src / "shared.bin").write_bytes(b"s" * 3 * BLOCK)
        (src / "data.bin").write_bytes(seed * (2 * BLOCK))
    hub_dir = tmp_path / "hub"
    assert publish(hub_dir, "ds", v1, "--block-size", str(BLOCK)) == "v1"
    with LocalStack() as stack:
        hub = stack.start_hub(hub_dir)
        cache, mnt = tmp_path / "cache", tmp_path / "mnt"
        stack.start_spoke(hub, cache, mnt, "64MiB")
        ds = mnt / "ds"
        assert os.readlink(ds / "latest") == "v1"
        held = open(ds / "latest" / "data.bin", "rb")  # noqa: SIM115 (kept open across changes)
        first = held.read(BLOCK)
        assert first == (v1 / "data.bin").read_bytes()[:BLOCK]
        (ds / "v1" / "shared.bin").read_bytes()

        assert publish(hub_dir, "ds", v2, "--block-size", str(BLOCK)) == "v2"  # latest -> v2
        took = _within(2.0, lambda: os.readlink(ds / "latest") == "v2")
        assert (ds / "latest" / "data.bin").read_bytes() == (v2 / "data.bin").read_bytes()
        assert held.read() == (v1 / "data.bin").read_bytes()[BLOCK:]  # never a mix
        del took

        v1_only = [p for p in (cache / "blocks").rglob("*") if p.is_file()]
        _hub(hub_dir, "revoke", "ds", "v1")
        _within(2.0, lambda: "v1" not in os.listdir(ds))
        with pytest.raises(FileNotFoundError):
            open(ds / "v1" / "data.bin", "rb")  # noqa: SIM115
        held.seek(0)
        with pytest.raises(OSError) as info:
            held.read(10)
        assert info.value.errno == errno.EIO
        held.close()
        assert (ds / "v2" / "shared.bin").read_bytes() == (v2 / "shared.bin").read_bytes()
        remaining = {p.name for p in (cache / "blocks").rglob("*") if p.is_file()}
        v1_data = {p.name for p in v1_only} - remaining
        assert v1_data, "v1's own blocks were not purged"
