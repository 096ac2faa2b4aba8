"""Shared helpers for the hub's integration tests: certificates, an S3 server, clients.

Everything listens on 127.0.0.1 with port 0; certificates are made fresh per session.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from deploy.pki import Leaf, LocalCa
from hub.serve.metrics import HubMetrics
from hub.snapshot.blocks import block_digest
from protocol.hub.v1 import hub_pb2, hub_pb2_grpc

RPC_TIMEOUT = 10.0


@dataclass(frozen=True)
class Pki:
    """The hub's CA with a server and a client certificate, and a foreign CA's client."""

    ca: LocalCa
    server: Leaf
    client: Leaf
    foreign_client: Leaf


@pytest.fixture(scope="session", name="pki")
def pki_fixture(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A fresh PKI for the session (import ``pki_fixture`` to use the ``pki`` fixture)."""
    directory = tmp_path_factory.mktemp("pki")
    ca = LocalCa(directory, "strata-test-ca")
    foreign = LocalCa(directory, "foreign-ca")
    return Pki(ca, ca.issue("hub-server"), ca.issue("spoke-client"), foreign.issue("intruder"))


@dataclass(frozen=True)
class S3Server:
    """An S3-compatible server (moto) on 127.0.0.1 and a fresh bucket URL maker."""

    endpoint: str

    def bucket(self, name: str) -> str:
        """Creates a bucket; returns ``s3://name/blobs``."""
        import boto3

        client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")
        client.create_bucket(Bucket=name)
        return f"s3://{name}/blobs"


@pytest.fixture(scope="session", name="s3_server")
def s3_server_fixture() -> Iterator[S3Server]:
    """moto in server mode on 127.0.0.1, port 0, with dummy credentials in the env."""
    from moto.server import ThreadedMotoServer

    saved = {key: os.environ.get(key) for key in _S3_ENV}
    os.environ.update(_S3_ENV)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield S3Server(f"http://{host}:{port}")
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


_S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
S3_ENV = dict(_S3_ENV)
"""Environment a child process needs to reach the test S3 server (dummy credentials)."""


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    """gRPC call metadata carrying a bearer token."""
    return (("authorization", f"Bearer {token}"),)


def sample(metrics: HubMetrics, method: str, code: str) -> float:
    """``strata_hub_requests_total{method,code}``, 0 when never counted."""
    value = metrics.registry.get_sample_value(
        "strata_hub_requests_total", {"method": method, "code": code}
    )
    return value or 0.0


def read_all(
    stub: hub_pb2_grpc.HubStub,
    digests: list[str],
    metadata: tuple[tuple[str, str], ...] = (),
) -> dict[str, bytes]:
    """Reads whole blocks through ReadBlocks; checks offsets and digests."""
    chunks = stub.ReadBlocks(
        iter([hub_pb2.ReadBlocksRequest(digests=digests)]), timeout=RPC_TIMEOUT, metadata=metadata
    )
    blocks: dict[str, bytes] = {}
    current = b""
    for chunk in chunks:
        assert chunk.offset == len(current)
        current += chunk.data
        if chunk.last:
            assert block_digest(current) == chunk.digest
            blocks[chunk.digest] = current
            current = b""
    return blocks


def serves(stub: hub_pb2_grpc.HubStub, metadata: tuple[tuple[str, str], ...] = ()) -> bool:
    """True when the hub still answers ListDatasets."""
    stub.ListDatasets(hub_pb2.ListDatasetsRequest(), timeout=RPC_TIMEOUT, metadata=metadata)
    return True


def insecure_stub(port: int) -> tuple[grpc.Channel, hub_pb2_grpc.HubStub]:
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    return channel, hub_pb2_grpc.HubStub(channel)


def write_tree(root: Path, files: dict[str, bytes]) -> Path:
    """Writes ``files`` (relative path -> bytes) under ``root``; returns ``root``."""
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return root


def manifest(
    stub: hub_pb2_grpc.HubStub,
    dataset: str,
    ref: str = "latest",
    metadata: tuple[tuple[str, str], ...] = (),
) -> dict[str, hub_pb2.ManifestEntry]:
    """A snapshot's manifest by path."""
    request = hub_pb2.GetManifestRequest(dataset=dataset, ref=ref)
    return {
        entry.path: entry
        for entry in stub.GetManifest(request, timeout=RPC_TIMEOUT, metadata=metadata)
    }


@dataclass
class HubProcess:
    """A ``strata-hub serve`` child process on 127.0.0.1 (its memory measured from
    outside, as an operator's would be).

    Attributes:
        proc: The process.
        port: Its gRPC port.
        metrics: Its ``/metrics`` URL.
        data: Its data directory.
    """

    proc: subprocess.Popen[str]
    port: int
    metrics: str
    data: Path

    def status_kib(self, field: str) -> int:
        """A ``/proc/PID/status`` field in KiB (``VmRSS``, ``VmHWM``)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise AssertionError(f"no {field} in /proc/{self.proc.pid}/status")

    def metric(self, name: str) -> float:
        """The first sample of ``name`` (with any labels written in it), 0 when absent."""
        text = urllib.request.urlopen(self.metrics, timeout=10).read().decode()
        for line in text.splitlines():
            if line.startswith((name + " ", name + "{")):
                return float(line.rsplit(" ", 1)[1])
        return 0.0


@contextlib.contextmanager
def hub_process(data: Path, *args: str) -> Iterator[HubProcess]:
    """Runs ``python -m hub serve --data-dir DATA --listen 127.0.0.1:0 --metrics
    127.0.0.1:0 ARGS`` until the block ends (then kills it)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hub",
            "serve",
            "--data-dir",
            str(data),
            "--listen",
            "127.0.0.1:0",
            "--metrics",
            "127.0.0.1:0",
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        umask=0o022,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        serving = re.search(r":(\d+)$", proc.stdout.readline().strip())
        metrics = re.search(r"metrics on (http://\S+/metrics)", proc.stderr.readline())
        assert serving and metrics, "hub did not start"
        yield HubProcess(proc, int(serving[1]), metrics[1], data)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)
