"""A lying peer against a spoke daemon: the daemon's memory and the read, measured.

    python -m bench.peer_flood [--size 300000] [--seconds 15] [--json FILE]

One hub and one spoke daemon on 127.0.0.1, in a mesh with a fake peer that owns the only
block of a ``--size``-byte file and answers every request for it with 4 MiB chunks never
marked last, forever. The daemon is asked for the block (EnsureBlocks, as the mount asks
on a miss) and given ``--seconds`` to deliver it. Reported: the daemon's resident memory
before and after and its peak (``VmRSS``/``VmHWM`` from ``/proc``), the bytes the liar got
out before it was cut off, and how the read ended and when. The daemon's limit in the
DaemonSet is 1 GiB; ``tests/integration/test_spoke_mesh_liars.py`` holds it under 512 MiB.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
import grpc.aio
import httpx

from bench.liars import Liar, memory
from deploy.local import LocalStack, admin_headers, free_port, publish, stop_process
from deploy.pki import region_flags
from protocol.hub.v1 import hub_pb2
from protocol.spoke.v1 import peer_pb2_grpc, spoke_pb2, spoke_pb2_grpc
from spoke.disk.layout import CacheLayout, block_digest
from spoke.mesh.rendezvous import owner

MiB = 1 << 20


@dataclass
class Result:
    """One run."""

    block_bytes: int
    rss_before_bytes: int
    rss_after_bytes: int
    peak_bytes: int
    liar_sent_bytes: int
    outcome: str
    read_s: float


def _serve(liar: Liar, node: str, flags: dict[str, str], stop: asyncio.Event) -> threading.Event:
    started = threading.Event()
    credentials = grpc.ssl_server_credentials(
        [(Path(flags["--peer-key"]).read_bytes(), Path(flags["--peer-cert"]).read_bytes())],
        root_certificates=Path(flags["--peer-ca"]).read_bytes(),
        require_client_auth=True,
    )

    async def serve() -> None:
        server = grpc.aio.server(options=[("grpc.max_send_message_length", 64 * MiB)])
        peer_pb2_grpc.add_SpokePeerServicer_to_server(liar, server)  # type: ignore[no-untyped-call]
        server.add_secure_port(node, credentials)
        await server.start()
        started.set()
        await stop.wait()
        await server.stop(0)

    threading.Thread(target=asyncio.run, args=(serve(),), daemon=True).start()
    return started


def run(work: Path, size: int, seconds: float) -> Result:
    """Publish a one-block file the liar owns, start the hub, the liar and the daemon,
    ask for the block, measure.

    Raises:
        RuntimeError: a process did not start or the mesh did not form.
    """
    me, liar_node = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    while True:
        data = os.urandom(size)
        if owner(block_digest(data), [me, liar_node]) == liar_node:
            break
    src = work / "src"
    src.mkdir()
    (src / "one.bin").write_bytes(data)
    publish(work / "hub", "bench", src, "--block-size", str(max(size, 64 * 1024)))
    secured = region_flags(work / "region")
    flags = dict(zip(secured[::2], secured[1::2], strict=True))
    liar, stop = Liar(liar_node, "flood"), asyncio.Event()
    if not _serve(liar, liar_node, flags, stop).wait(10):
        raise RuntimeError("the fake peer did not start")
    cache = work / "cache"
    with LocalStack() as stack:
        hub = stack.start_hub(work / "hub", extra=("--insecure",))
        cmd = [sys.executable, "-m", "spoke", "daemon", "--hub", hub, "--cache-dir", str(cache)]
        cmd += ["--cache-size", "256MiB", "--admin", "127.0.0.1:0", "--log-level", "ERROR"]
        cmd += ["--peer-listen", me, "--peers", f"{me},{liar_node}", "--peer-timeout", "10"]
        proc = subprocess.Popen([*cmd, *secured], start_new_session=True)
        try:
            deadline = time.monotonic() + 60
            while not (cache / "admin.url").exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the spoke daemon did not start")
                time.sleep(0.05)
            admin = (cache / "admin.url").read_text().strip()
            while True:  # the liar answered a probe, and the daemon holds a read grant
                mesh = httpx.get(f"{admin}/v1/cache", headers=admin_headers(cache), timeout=10)
                state = mesh.json()["mesh"]
                if state["nodes_live"] == 2 and state["grant"]["valid"]:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("the mesh did not form")
                time.sleep(0.05)
            before, _ = memory(proc.pid)
            socket = f"unix:{CacheLayout(cache).socket_path}"
            options = [("grpc.max_receive_message_length", 256 * MiB)]
            ref = hub_pb2.BlockRef(digest=block_digest(data), size=size)
            started = time.monotonic()
            with grpc.insecure_channel(socket, options=options) as channel:
                try:
                    spoke_pb2_grpc.SpokeLocalStub(channel).EnsureBlocks(
                        spoke_pb2.EnsureBlocksRequest(blocks=[ref]), timeout=seconds
                    )
                    outcome = "ok"
                except grpc.RpcError as err:
                    outcome = err.code().name
            read_s = time.monotonic() - started
            after, peak = memory(proc.pid)
        finally:
            stop_process(proc)
    return Result(size, before, after, peak, liar.sent, outcome, read_s)


def main(argv: list[str] | None = None) -> int:
    """Entry point: one run, printed; exit 1 if the read did not succeed."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.peer_flood",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--size", type=int, default=300_000, help="block bytes")
    parser.add_argument("--seconds", type=float, default=15.0, help="the read's deadline")
    parser.add_argument("--json", type=Path, default=None)
    ns = parser.parse_args(argv)
    if not 0 < ns.size <= 64 * MiB or ns.seconds <= 0:
        parser.error("--size must be 1 byte to 64 MiB and --seconds positive")
    with tempfile.TemporaryDirectory(prefix="strata-flood-") as tmp:
        r = run(Path(tmp), ns.size, ns.seconds)
    print(
        f"flooding peer, {r.block_bytes:,}-byte block: read {r.outcome} in {r.read_s:.2f} s; "
        f"daemon RSS {r.rss_before_bytes / MiB:.0f} -> {r.rss_after_bytes / MiB:.0f} MiB, "
        f"peak {r.peak_bytes / MiB:.0f} MiB; the liar got {r.liar_sent_bytes / MiB:.0f} MiB out"
    )
    if ns.json:
        ns.json.write_text(json.dumps(asdict(r), indent=2))
    return 0 if r.outcome == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
