"""``strata-hub`` as a user runs it: real processes, real sockets on 127.0.0.1."""

from __future__ import annotations

import re
import select
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from hub.serve.serverthread import ServerThread
from protocol.hub.v1 import hub_pb2, hub_pb2_grpc
from tests.integration.hub_support import (
    Pki,
    bearer,
    pki_fixture,  # noqa: F401  (the pki fixture)
)

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).parent / "strata-hub"
COMMAND = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "hub"]
SERVING = re.compile(r"strata-hub: serving (?P<dir>.+) on 127\.0\.0\.1:(?P<port>\d+)\n")
ERROR = re.compile(r"strata-hub: error: [^\n]+\n")
START_TIMEOUT = 30.0


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COMMAND, *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def assert_one_line_error(done: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert ERROR.fullmatch(done.stderr), done.stderr
    assert "Traceback" not in done.stderr
    for fragment in fragments:
        assert fragment in done.stderr


def read_line(process: subprocess.Popen[str], timeout: float) -> str:
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    if not ready:
        process.kill()
        raise AssertionError(f"no output within {timeout} s; stderr: {process.communicate()[1]}")
    return process.stdout.readline()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.bin").write_bytes(b"a" * 300)
    (src / "sub" / "b.txt").write_bytes(b"b")
    return src


@pytest.fixture
def serving(tmp_path: Path, tree: Path) -> Iterator[tuple[subprocess.Popen[str], int, Path]]:
    """A ``strata-hub serve`` process on 127.0.0.1:0 with one published version."""
    data = tmp_path / "data"
    assert run("publish", "--data-dir", str(data), "f3", str(tree)).returncode == 0
    port_file = tmp_path / "port"
    process = subprocess.Popen(
        [
            *COMMAND,
            "serve",
            "--data-dir",
            str(data),
            "--listen",
            "127.0.0.1:0",
            "--port-file",
            str(port_file),
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = read_line(process, START_TIMEOUT)
        match = SERVING.fullmatch(line)
        assert match, line
        assert match["dir"] == str(data)
        port = int(match["port"])
        assert port > 0
        assert port_file.read_text() == f"{port}\n"
        yield process, port, data
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=10)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serve_prints_one_line_and_stops_cleanly(
    serving: tuple[subprocess.Popen[str], int, Path], signum: signal.Signals
) -> None:
    process, port, _ = serving
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = hub_pb2_grpc.HubStub(channel)
        snapshot = stub.ResolveRef(
            hub_pb2.ResolveRefRequest(dataset="f3", ref="latest"), timeout=10
        )
        assert snapshot.version == "v1"
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=15)
    assert process.returncode == 0, stderr
    assert stdout == "", "serve prints exactly one line"
    assert "Traceback" not in stderr


def test_serve_refuses_a_port_in_use(serving: tuple[subprocess.Popen[str], int, Path]) -> None:
    _, port, data = serving
    done = run("serve", "--data-dir", str(data), "--listen", f"127.0.0.1:{port}")
    assert_one_line_error(done, f"127.0.0.1:{port}", "in use")


def test_serve_refuses_a_missing_data_dir(tmp_path: Path) -> None:
    done = run("serve", "--data-dir", str(tmp_path / "absent"), "--listen", "127.0.0.1:0")
    assert_one_line_error(done, "does not exist")


def test_serve_refuses_a_malformed_address(tmp_path: Path) -> None:
    done = run("serve", "--data-dir", str(tmp_path), "--listen", "nowhere")
    assert_one_line_error(done, "invalid address 'nowhere'")


def test_serve_with_metrics(tmp_path: Path, tree: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    process = subprocess.Popen(
        [
            *COMMAND,
            "serve",
            "--data-dir",
            str(data),
            "--listen",
            "127.0.0.1:0",
            "--metrics",
            "127.0.0.1:0",
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        match = SERVING.fullmatch(read_line(process, START_TIMEOUT))
        assert match
        with grpc.insecure_channel(f"127.0.0.1:{match['port']}") as channel:
            hub_pb2_grpc.HubStub(channel).ListDatasets(hub_pb2.ListDatasetsRequest(), timeout=10)
        assert process.stderr is not None
        ready, _, _ = select.select([process.stderr], [], [], START_TIMEOUT)
        assert ready
        announced = re.search(
            r"metrics on (http://127\.0\.0\.1:\d+/metrics)", process.stderr.readline()
        )
        assert announced
        with urllib.request.urlopen(announced[1], timeout=10) as response:
            text = response.read().decode()
        assert 'strata_hub_requests_total{code="OK",method="ListDatasets"} 1.0' in text
        assert "strata_hub_blocks_served_bytes_total" in text
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=15)
        assert process.returncode == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=10)


def test_publish_and_ls(tmp_path: Path, tree: Path) -> None:
    data = tmp_path / "data"
    first = run("publish", "--data-dir", str(data), "f3", str(tree), "--block-size", "128")
    assert first.returncode == 0, first.stderr
    assert first.stdout == "v1\n"
    assert re.fullmatch(
        r"strata-hub: published f3 v1 \(tag latest\): 2 files, 301 bytes, 3 new blocks, "
        r"173 new bytes, snapshot [0-9a-f]{32}\n",
        first.stderr,
    ), first.stderr
    second = run("publish", "--data-dir", str(data), "f3", str(tree), "--tag", "stable")
    assert second.stdout == "v2\n"
    listing = run("ls", "--data-dir", str(data))
    assert listing.returncode == 0
    assert listing.stdout.splitlines() == ["DATASET  VERSIONS  LATEST", "f3       2         v2"]
    versions = run("ls", "--data-dir", str(data), "f3").stdout.splitlines()
    assert versions[0].split() == ["VERSION", "CREATED", "FILES", "BYTES", "SNAPSHOT", "TAGS"]
    v1, v2 = (line.split() for line in versions[1:])
    assert (v1[0], v1[2], v1[3], v1[5]) == ("v1", "2", "301", "latest")
    assert (v2[0], v2[2], v2[3], v2[5]) == ("v2", "2", "301", "stable")


def test_publish_errors_are_one_line(tmp_path: Path, tree: Path) -> None:
    data = tmp_path / "data"
    assert run("publish", "--data-dir", str(data), "f3", str(tree)).stdout == "v1\n"
    missing = tmp_path / "missing"
    assert_one_line_error(
        run("publish", "--data-dir", str(data), "f3", str(missing)),
        f"source dir {missing} does not exist",
    )
    assert_one_line_error(
        run("publish", "--data-dir", str(data), "Bad/Name", str(tree)), "invalid dataset name"
    )
    listing = run("ls", "--data-dir", str(data), "f3").stdout.splitlines()
    assert [line.split()[0] for line in listing[1:]] == ["v1"]


def test_ls_errors_are_one_line(tmp_path: Path) -> None:
    assert_one_line_error(run("ls", "--data-dir", str(tmp_path / "absent")), "does not exist")
    assert_one_line_error(run("bogus"), "No such command")


def test_server_thread_reports_start_failures(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="does not exist"):
        ServerThread(tmp_path / "absent").start()
    with ServerThread(tmp_path) as running:
        start = time.monotonic()
        with pytest.raises(Exception, match="in use"):
            ServerThread(tmp_path, f"127.0.0.1:{running.port}").start()
        assert time.monotonic() - start < 10


def test_serve_with_mtls_tokens_and_metrics(tmp_path: Path, tree: Path, pki: Pki) -> None:
    """Every security and operations flag, wired through the real command line."""
    data = tmp_path / "data"
    assert run("publish", "--data-dir", str(data), "f3", str(tree)).returncode == 0
    token = "cli-test-token-0123456789"
    tokens = tmp_path / "tokens.json"
    tokens.write_text(f'{{"{token}": ["f3"]}}')
    process = subprocess.Popen(
        [
            *COMMAND,
            "serve",
            "--data-dir",
            str(data),
            "--listen",
            "127.0.0.1:0",
            "--metrics",
            "127.0.0.1:0",
            "--tls-cert",
            str(pki.server.cert),
            "--tls-key",
            str(pki.server.key),
            "--client-ca",
            str(pki.ca.pem.cert),
            "--tokens",
            str(tokens),
            "--max-message-bytes",
            "1048576",
            "--grace",
            "2",
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        match = SERVING.fullmatch(read_line(process, START_TIMEOUT))
        assert match
        assert process.stderr is not None
        announced = re.search(r"metrics on (http://\S+/metrics)", process.stderr.readline())
        assert announced
        credentials = grpc.ssl_channel_credentials(
            root_certificates=pki.ca.pem.cert_bytes,
            private_key=pki.client.key_bytes,
            certificate_chain=pki.client.cert_bytes,
        )
        with grpc.secure_channel(f"127.0.0.1:{match['port']}", credentials) as channel:
            stub = hub_pb2_grpc.HubStub(channel)
            request = hub_pb2.ResolveRefRequest(dataset="f3", ref="latest")
            assert stub.ResolveRef(request, timeout=10, metadata=bearer(token)).version == "v1"
            with pytest.raises(grpc.RpcError) as caught:
                stub.ResolveRef(request, timeout=10)
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.RpcError) as caught:
                big = hub_pb2.ResolveRefRequest(dataset="f" * 40_000, ref="latest")  # > 32 KiB
                stub.ResolveRef(big, timeout=10, metadata=bearer(token))
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        with urllib.request.urlopen(announced[1], timeout=10) as response:
            text = response.read().decode()
        for line in (
            'strata_hub_requests_total{code="OK",method="ResolveRef"} 1.0',
            'strata_hub_requests_total{code="UNAUTHENTICATED",method="ResolveRef"} 1.0',
            'strata_hub_requests_total{code="RESOURCE_EXHAUSTED",method="ResolveRef"} 1.0',
            "strata_hub_catalog_datasets 1.0",
            'strata_hub_catalog_versions{state="live"} 1.0',
            "strata_hub_active_streams",
            "strata_hub_publish_duration_seconds_bucket",
        ):
            assert line in text, line
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=15)
        assert process.returncode == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=10)


def test_serve_refuses_bad_security_settings(tmp_path: Path, pki: Pki) -> None:
    bad_tokens = tmp_path / "tokens.yaml"
    bad_tokens.write_text('"short": "*"\n')
    base = ["serve", "--data-dir", str(tmp_path), "--listen", "127.0.0.1:0"]
    assert_one_line_error(run(*base, "--tls-cert", str(pki.server.cert)), "--tls-key")
    assert_one_line_error(run(*base, "--tokens", str(bad_tokens)), "at least 16")
    assert_one_line_error(run(*base, "--max-message-bytes", "10"), "below")


def test_serve_refuses_tokens_without_tls(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text('"a-token-of-sixteen-chars-or-more": "*"\n')
    base = ["serve", "--data-dir", str(tmp_path), "--listen", "127.0.0.1:0"]
    assert_one_line_error(run(*base, "--tokens", str(tokens)), "cleartext")
