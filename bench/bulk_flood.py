"""What a flood of half-sent requests makes the hub's bulk port hold.

    python -m bench.bulk_flood [--connections 1100] [--rounds 3]

Publishes 1 MiB to a local hub that serves the bulk channel (``--bulk-port``) with
tokens, then, each round, opens ``--connections`` connections to the bulk port (more
than ``--bulk-max-connections``' 1,024, so the last are refused), each sending a request
head that announces a 4 KiB token and then 4,000 bytes of it, never the rest; holds them
2 s, closes them. Prints the hub's RSS (``/proc/PID/status`` ``VmRSS``) at rest, while each
round is held, and 11 s after the last (past one heap trim). Everything on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import sys
import tempfile
import time
from pathlib import Path

from deploy.local import LocalStack, publish
from protocol import bulk

TOKEN = "bench-bulk-flood-0123456789abcdef"


def rss_mib(pid: int) -> int:
    """Resident memory of ``pid``, MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    raise OSError(f"no VmRSS for process {pid}")


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the rounds, print RSS; 0 unless the hub failed to start."""
    parser = argparse.ArgumentParser(prog="python -m bench.bulk_flood", description=__doc__)
    parser.add_argument("--connections", type=int, default=1100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 2 * args.connections)), hard))
    with tempfile.TemporaryDirectory(prefix="strata-bulk-flood-") as tmp:
        work = Path(tmp)
        (work / "src").mkdir()
        (work / "src" / "a.bin").write_bytes(os.urandom(1 << 20))
        publish(work / "hub", "ds", work / "src")
        tokens = work / "tokens.yaml"
        tokens.write_text(f'"{TOKEN}": "*"\n')
        port_file = work / "bulk.port"
        with LocalStack() as stack:
            stack.start_hub(
                work / "hub",
                extra=(
                    "--bulk-port",
                    "0",
                    "--bulk-port-file",
                    str(port_file),
                    "--tokens",
                    str(tokens),
                    "--insecure",
                ),
            )
            assert stack.hub is not None
            pid, port = stack.hub.pid, int(port_file.read_text())
            time.sleep(1)
            print(f"hub RSS at rest: {rss_mib(pid)} MiB", flush=True)
            peak = 0
            for round_ in range(args.rounds):
                held = []
                for _ in range(args.connections):
                    sock = socket.create_connection(("127.0.0.1", port))
                    sock.sendall(bulk.REQUEST_HEAD.pack(bulk.MAGIC, 4096) + b"x" * 4000)
                    held.append(sock)
                time.sleep(2)
                now = rss_mib(pid)
                peak = max(peak, now)
                print(f"round {round_ + 1}: {len(held)} connections held, RSS {now} MiB")
                for sock in held:
                    sock.close()
                time.sleep(1)
            time.sleep(11)
            print(f"hub RSS after: {rss_mib(pid)} MiB (peak while held {peak} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
