"""What one token's bulk connections that never read make a hub hold, under TLS.

    python -m bench.bulk_stall [--connections 1024] [--hold 8]

Publishes one 1 MiB file to a hub (``strata-hub serve`` as its own process on 127.0.0.1,
TLS, tokens, ``--bulk-port``), then opens ``--connections`` TLS connections to the bulk
port from one address, each with a 4 KiB receive buffer, each asking for the file's one
block with the same valid token, reading 100 bytes and then nothing; holds them
``--hold`` seconds. Prints the hub's resident memory (``VmRSS``) at rest, its peak while
they are held (sampled every 0.2 s) and the growth a connection. Issue 39's seventeenth
probe took a hub from 127 to 1,516 MiB this way (its Deployment's limit is 1 GiB): the
block sat unread in the socket transport beneath asyncio's TLS layer, counted nowhere.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from deploy.local import free_port
from deploy.pki import LocalCa
from protocol import bulk
from tests.support import publish

TOKEN = "bench-bulk-stall-0123456789abcdef"


def _rss_mib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    raise OSError(f"no VmRSS for process {pid}")


def main(argv: list[str] | None = None) -> int:
    """Entry point: hold the connections, print the hub's memory; 1 if the hub failed."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=1024)
    parser.add_argument("--hold", type=float, default=8.0)
    args = parser.parse_args(argv)
    if not 1 <= args.connections <= 4096 or args.hold <= 0:
        parser.error("--connections must be 1 to 4096 and --hold positive")
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with tempfile.TemporaryDirectory(prefix="bulk-stall-") as tmp:
        root = Path(tmp)
        (root / "src").mkdir()
        (root / "src" / "a.bin").write_bytes(os.urandom(1 << 20))
        publish(root / "hub", "ds", root / "src")
        digest = next(
            p.name for p in (root / "hub").rglob("*") if p.is_file() and p.stat().st_size == 1 << 20
        )
        ca = LocalCa(root, "bench-ca")
        leaf = ca.issue("hub")
        (root / "tokens.yaml").write_text(f'"{TOKEN}": "*"\n')
        port, bulk_port = free_port(), free_port()
        hub = subprocess.Popen(
            [sys.executable, "-m", "hub.cli.main", "serve", "--data-dir", str(root / "hub"),
             "--listen", f"127.0.0.1:{port}", "--tls-cert", str(leaf.cert),
             "--tls-key", str(leaf.key), "--tokens", str(root / "tokens.yaml"),
             "--bulk-port", str(bulk_port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            context = ssl.create_default_context(cafile=str(ca.cert))
            deadline = time.monotonic() + 30
            while True:
                try:
                    socket.create_connection(("127.0.0.1", bulk_port), timeout=1).close()
                    break
                except OSError:
                    if hub.poll() is not None or time.monotonic() > deadline:
                        print("the hub did not start", file=sys.stderr)
                        return 1
                    time.sleep(0.2)
            rest = _rss_mib(hub.pid)
            peak, stop = [rest], threading.Event()

            def sample() -> None:
                while not stop.wait(0.2):
                    peak[0] = max(peak[0], _rss_mib(hub.pid))

            threading.Thread(target=sample, daemon=True).start()
            request = bulk.encode_request(TOKEN, [digest])
            held = []
            for _ in range(args.connections):
                raw = socket.socket()
                raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                raw.bind(("127.0.0.5", 0))
                raw.settimeout(10)
                raw.connect(("127.0.0.1", bulk_port))
                tls = context.wrap_socket(raw, server_hostname="localhost")
                tls.sendall(request)
                tls.recv(100)
                held.append(tls)
            time.sleep(args.hold)
            stop.set()
            grown = (peak[0] - rest) * 1024 / args.connections
            print(
                f"{args.connections} stalled TLS bulk connections of one token: hub RSS "
                f"{rest} MiB at rest, peak {peak[0]} MiB ({grown:,.0f} KiB a connection)"
            )
            for tls in held:
                tls.close()
        finally:
            hub.kill()
            hub.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
