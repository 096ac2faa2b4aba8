"""A spoke with two hub replicas reads through one replica's SIGKILL.

Two ``strata-hub serve --catalog URL`` replicas over one PostgreSQL catalog and one blob
store; a spoke mounted with ``--hub A,B`` and 4 cold readers. The replica holding the
spoke's Watch stream is killed while the readers are under way: every read succeeds with
the right bytes (the block streams it had in flight are retried on the other replica),
and Watch resumes on the survivor, so a publish made after the kill reaches the spoke.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from deploy.local import LocalStack, admin_headers, free_port
from hub.publish.tree import publish
from tests.integration.mesh_support import metric
from tests.support import eventually, requires_fuse, sha256

pytestmark = [pytest.mark.fuse, requires_fuse]

BLOCK = 128 << 10
FILES = 96
FILE_BYTES = 4 * BLOCK  # 48 MiB in all


def test_a_replica_killed_under_four_readers_costs_no_read_and_watch_resumes(
    tmp_path: Path, pg_url: str
) -> None:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    for i in range(FILES):
        (src / "d" / f"f{i:03d}.bin").write_bytes(os.urandom(FILE_BYTES))
    blobs = str(tmp_path / "blobs")
    publish(tmp_path / "pub", "ds", src, catalog=pg_url, blobs=blobs, block_size=BLOCK)
    with LocalStack(log_level="INFO") as stack:
        replicas = []
        for i in range(2):
            port = free_port()
            address = stack.start_hub(
                tmp_path / f"replica{i}", metrics=f"127.0.0.1:{port}", extra=("--catalog", pg_url)
            )
            replicas.append((address, f"http://127.0.0.1:{port}/metrics", stack.hub))
        cache, mnt = tmp_path / "cache", tmp_path / "mnt"
        admin = stack.start_spoke(
            ",".join(address for address, _, _ in replicas),
            cache,
            mnt,
            "1GiB",
            extra=("--background-fill", "off"),
        )
        eventually(
            lambda: (
                sum(metric(m, "strata_hub_active_streams", method="Watch") for _, m, _ in replicas)
                == 1
            ),
            "the spoke's Watch stream is open on one replica",
        )
        doomed = next(
            r for r in replicas if metric(r[1], "strata_hub_active_streams", method="Watch") == 1
        )
        survivor = next(r for r in replicas if r is not doomed)
        files = sorted((mnt / "ds" / "v1" / "d").iterdir())
        read = 0
        lock = threading.Lock()
        errors: list[BaseException] = []

        def check(path: Path) -> None:
            nonlocal read
            try:
                assert sha256(path) == sha256(src / "d" / path.name), path.name
            except BaseException as err:  # every failure is reported, none stops the others
                errors.append(err)
            with lock:
                read += 1

        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(check, path) for path in files]
            eventually(lambda: read >= FILES // 4, "a quarter of the files read")
            served = metric(doomed[1], "strata_hub_blocks_served_total")
            killed_at = time.monotonic()
            assert doomed[2] is not None
            doomed[2].send_signal(signal.SIGKILL)
            for future in futures:
                future.result()
        assert errors == [], errors[:3]
        assert read == FILES
        assert served > 0, "the killed replica was serving blocks before its death"
        assert metric(survivor[1], "strata_hub_blocks_served_total") > 0
        # Watch resumes on the survivor: a publish after the kill reaches the spoke
        (src / "d" / "f000.bin").write_bytes(os.urandom(FILE_BYTES))
        publish(tmp_path / "pub", "ds", src, catalog=pg_url, block_size=BLOCK)
        eventually(
            lambda: (
                metric(f"{admin}/metrics", "strata_spoke_watch_sequence", admin_headers(cache)) >= 4
            ),
            "the spoke applied the events of v2 (published after the kill)",
            timeout=30,
        )
        assert metric(survivor[1], "strata_hub_active_streams", method="Watch") == 1
        assert time.monotonic() - killed_at < 60
        latest = mnt / "ds" / "latest"
        eventually(lambda: os.readlink(latest) == "v2", "latest -> v2 at the mount")
        assert sha256(latest / "d" / "f000.bin") == sha256(src / "d" / "f000.bin")
