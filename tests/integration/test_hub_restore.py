"""The restore drill (issue 44, item 5), against real PostgreSQL and SeaweedFS: the catalog
is backed up (``pg_dump``), a version is revoked and ``gc`` runs, then the catalog is
restored from the backup. With ``gc``'s grace every block the restored catalog references
is still in the bucket and verifies; with no grace (the control) the drill loses them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.postgres import PostgresServer
from tests.integration.hub_support import S3_ENV, S3Server
from tests.integration.seaweedfs import seaweedfs_fixture  # noqa: F401  (seaweedfs)


def _hub(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hub", *args],
        capture_output=True,
        text=True,
        env=os.environ | S3_ENV,
        timeout=120,
    )


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


@pytest.mark.parametrize("grace", ["604800", "0"])
def test_a_catalog_restored_from_a_backup_finds_every_block_it_references(
    tmp_path: Path,
    pg_server: PostgresServer,
    seaweedfs: S3Server,
    grace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key, value in S3_ENV.items():  # the credentials SeaweedFS knows
        monkeypatch.setenv(key, value)
    catalog = pg_server.database()
    blobs = seaweedfs.bucket(f"restore-{os.getpid()}-{grace}")
    where = ["--data-dir", str(tmp_path / "data"), "--catalog", catalog]
    endpoint = ["--s3-endpoint", seaweedfs.endpoint]  # for the commands that read blobs
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(os.urandom(200_000))
    (src / "b.bin").write_bytes(os.urandom(100_000))
    _ok(
        _hub(
            "publish", *where, *endpoint, "--blobs", blobs, "--block-size", "65536", "f3", str(src)
        )
    )

    # the nightly backup
    dump = tmp_path / "catalog.dump"
    pg_dump = str(pg_server.bindir / "pg_dump")
    done = subprocess.run([pg_dump, "-Fc", "-f", str(dump), "-d", catalog], capture_output=True)
    assert done.returncode == 0, done.stderr

    # the day after: v2 replaces a.bin, v1 is revoked, gc runs
    (src / "a.bin").write_bytes(os.urandom(200_000))
    _ok(_hub("publish", *where, *endpoint, "--block-size", "65536", "f3", str(src)))
    _ok(_hub("revoke", *where, "f3", "v1"))
    swept = _ok(_hub("gc", *where, *endpoint, "--grace", grace))

    # the catalog is lost; the backup is restored into a new database
    restored = pg_server.database()
    pg_restore = str(pg_server.bindir / "pg_restore")
    done = subprocess.run(
        [pg_restore, "--no-owner", "-d", restored, str(dump)], capture_output=True
    )
    assert done.returncode == 0, done.stderr
    (tmp_path / "new-host").mkdir(mode=0o700)  # a hub host rebuilt beside the restore
    back = ["--data-dir", str(tmp_path / "new-host"), "--catalog", restored, *endpoint]
    verified = _hub("verify", *back, "--blocks", "f3", "v1")
    if grace == "0":  # the control: gc deleted v1's own blocks, the backup points at them
        assert "deleted 4" in swept  # a.bin's four 64 KiB blocks (three and the rest)
        assert verified.returncode == 1 and "missing" in verified.stdout + verified.stderr
        return
    assert "deleted 0, 4 unreferenced within the 604800 s grace" in swept
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert verified.stdout.strip().endswith("ok, 6 blocks")
    # a gc on the restored catalog: v1 is live again, its blocks leave the candidates
    again = _ok(_hub("gc", *back, "--grace", grace))
    assert "deleted 0, 4 unreferenced" in again  # v2's own blocks, unknown to the backup
    assert _hub("verify", *back, "--blocks", "f3", "v1").returncode == 0
