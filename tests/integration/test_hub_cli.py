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

from hub.server import ServerThread
from protocol.hub.v1 import hub_pb2, hub_pb2_grpc

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
