"""A read the hub cannot serve fails after one ``--miss-deadline`` (issue 25, item 6), also
a whole-file read the kernel splits into several requests, through a real kernel mount."""

from __future__ import annotations

import errno
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.wan import CutMode, LinkSpec, WanProxy
from deploy.local import LocalStack
from tests.support import eventually_ok, publish, requires_fuse

pytestmark = [pytest.mark.fuse, requires_fuse]

BLOCK = 256 << 10
FILE = 8 << 20  # 32 blocks: the kernel asks for it in several requests (128 KiB to 1 MiB)
DEADLINE = 1.0  # --miss-deadline, seconds


@pytest.fixture
def stack() -> Iterator[LocalStack]:
    with LocalStack() as s:
        yield s


def _read_whole(path: Path) -> bytes:
    """The whole file, asked for in one read(2) call (and more only if it returns less)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        out = bytearray()
        while chunk := os.read(fd, FILE - len(out)):
            out += chunk
        return bytes(out)
    finally:
        os.close(fd)


@pytest.mark.timing  # bounds a read's wall-clock time: run alone (make pytest)
@pytest.mark.parametrize("mode", ["blackhole", "reset"])
def test_a_whole_file_read_the_hub_cannot_serve_fails_after_one_miss_deadline(
    tmp_path: Path, stack: LocalStack, mode: CutMode, capfd: pytest.CaptureFixture[str]
) -> None:
    """One read(2) of a whole uncached file, with the hub's link silent (blackhole) or
    refusing (reset, as a stopped hub): EIO within one deadline and a margin, although the
    kernel follows the failed request with another (its retry of the failed page; with a
    refusing link the daemon's backoff used to sleep past the deadline, so the retry
    joined a fetch still running and waited a second deadline: 2 x). Once the link is back
    the same read returns the file's bytes."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "seen.bin").write_bytes(os.urandom(BLOCK))
    (src / "whole.bin").write_bytes(os.urandom(FILE))
    publish(tmp_path / "hub", "ds", src, "--block-size", str(BLOCK))
    hub = stack.start_hub(tmp_path / "hub")
    host, port = hub.rsplit(":", 1)
    with WanProxy((host, int(port)), LinkSpec(rtt_s=0.0, rate_bps=math.inf)) as wan:
        mnt = tmp_path / "mnt"
        stack.start_spoke(
            wan.address,
            tmp_path / "cache",
            mnt,
            "64MiB",
            # no fill: the file must still be a miss when the link is cut
            extra=("--miss-deadline", f"{DEADLINE:g}", "--background-fill", "off"),
        )
        v1 = mnt / "ds" / "v1"
        assert (v1 / "seen.bin").read_bytes() == (src / "seen.bin").read_bytes()  # link up
        os.stat(v1 / "whole.bin")  # its manifest is loaded: only blocks are missing
        wan.cut(mode)
        start = time.monotonic()
        with pytest.raises(OSError) as info:
            _read_whole(v1 / "whole.bin")
        took = time.monotonic() - start
        assert info.value.errno == errno.EIO
        assert took < 1.5 * DEADLINE, f"the read failed after {took:.2f} s, deadline {DEADLINE} s"
        wan.restore()
        # nothing is poisoned: the read succeeds again once the link is back (a read at
        # once may still meet the outage's last fetch or gRPC's reconnect backoff)
        data = eventually_ok(
            lambda: _read_whole(v1 / "whole.bin"),
            "the read once the link is back",
            retry=lambda err: isinstance(err, OSError) and err.errno == errno.EIO,
        )
        assert data == (src / "whole.bin").read_bytes()
        stack.stop_spoke()
    assert "never retrieved" not in capfd.readouterr().err
