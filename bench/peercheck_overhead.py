"""Cost of the daemon socket's SO_PEERCRED front door (spoke/serve/frontdoor.py), side by side.

Starts a spoke daemon (no mount) over a local hub holding one snapshot of many small files,
then times the same calls to the daemon through ``daemon.sock`` (the front door the mount
uses) and straight to gRPC's private ``.grpc/sock``: small unary calls (RecordAccess, the
mount's hit reports) and a manifest stream (GetManifest, about 4 MB of pages).

    python -m bench.peercheck_overhead [--calls 2000] [--files 20000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from hub.publish.tree import publish
from hub.serve.serverthread import ServerThread
from protocol.hub.v1 import hub_pb2
from protocol.spoke.v1 import spoke_pb2, spoke_pb2_grpc


def _time(stub: spoke_pb2_grpc.SpokeLocalStub, calls: int) -> tuple[float, float]:
    start = time.perf_counter()
    for _ in range(calls):
        stub.RecordAccess(spoke_pb2.RecordAccessRequest(digests=[]), timeout=10)
    unary = (time.perf_counter() - start) / calls
    start = time.perf_counter()
    request = hub_pb2.GetManifestRequest(dataset="many", ref="v1")
    pages = list(stub.GetManifest(request, timeout=60))
    stream = time.perf_counter() - start
    size = sum(p.ByteSize() for p in pages)
    return unary, size / stream


def main() -> None:
    """Print per-call latency and stream throughput through both sockets, and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--files", type=int, default=20000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="strata-peercheck-") as tmp:
        base = Path(tmp)
        src = base / "src"
        src.mkdir()
        for i in range(args.files):
            (src / f"file-{i:06d}.bin").write_bytes(i.to_bytes(4, "big"))
        publish(base / "data", "many", src)
        with ServerThread(base / "data") as hub:
            cache = base / "cache"
            cmd = [sys.executable, "-m", "spoke", "daemon", "--hub", f"127.0.0.1:{hub.port}"]
            cmd += ["--cache-dir", str(cache), "--cache-size", "64MiB", "--admin", "127.0.0.1:0"]
            daemon = subprocess.Popen([*cmd, "--log-level", "ERROR"])
            try:
                while not (cache / "admin.url").exists():
                    time.sleep(0.05)
                results = {}
                for name in ("daemon.sock", ".grpc/sock", "daemon.sock", ".grpc/sock"):
                    with grpc.insecure_channel(f"unix:{cache / name}") as channel:
                        stub = spoke_pb2_grpc.SpokeLocalStub(channel)
                        _time(stub, 50)  # warm up (the first pass also loads the manifest)
                        results[name] = _time(stub, args.calls)
            finally:
                daemon.terminate()
                daemon.wait(20)
    front, direct = results["daemon.sock"], results[".grpc/sock"]
    print(f"{'socket':<26} {'unary call (us)':>16} {'stream (MB/s)':>14}")
    print(f"{'daemon.sock (peer check)':<26} {front[0] * 1e6:>16.0f} {front[1] / 1e6:>14.1f}")
    print(f"{'.grpc/sock (direct)':<26} {direct[0] * 1e6:>16.0f} {direct[1] / 1e6:>14.1f}")
    print(
        f"ratio front/direct: unary latency {front[0] / direct[0]:.2f}x, "
        f"stream throughput {front[1] / direct[1]:.2f}x (cores: {os.cpu_count()})"
    )


if __name__ == "__main__":
    main()
