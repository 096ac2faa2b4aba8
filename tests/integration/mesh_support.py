"""A region on 127.0.0.1 for the mesh's tests: one hub (its own metrics port) behind the WAN
emulator, and spoke daemons that peer with each other, each read through its socket.

The peer ports run as a real region's do: mTLS with one region certificate and a region
token (:func:`deploy.pki.region_flags`), and every spoke gets read grants from the hub."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.wan import LinkSpec, WanProxy
from deploy.local import LocalStack, admin_headers, free_port, stop_process
from deploy.pki import region_flags
from protocol.hub.v1 import hub_pb2
from protocol.spoke.v1 import peer_pb2_grpc, spoke_pb2, spoke_pb2_grpc
from spoke.disk.layout import CacheLayout, block_digest
from tests.support import eventually

BLOCK = 65_536


def metric(url: str, name: str, headers: dict[str, str] | None = None, **labels: str) -> float:
    """Sum of the samples ``name`` with ``labels`` at a Prometheus endpoint (a spoke's admin
    port needs its node token in ``headers``: :func:`deploy.local.admin_headers`)."""
    total = 0.0
    text = httpx.get(url, headers=headers, timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                total += sample.value
    return total


def wait_until(cond: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Poll ``cond`` every 50 ms until true; AssertionError naming ``what`` after ``timeout``."""
    eventually(cond, what, timeout)


@dataclass
class Spoke:
    """One spoke daemon of the region."""

    name: str
    cache: Path
    peer_port: int
    extra: tuple[str, ...] = ()
    proc: subprocess.Popen[bytes] | None = None
    host: str = "127.0.0.1"  # another of 127.0.0.0/8 lets spokes share one bulk peer port

    @property
    def node(self) -> str:
        return f"{self.host}:{self.peer_port}"

    @property
    def admin(self) -> str:
        return (self.cache / "admin.url").read_text().strip()

    def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = httpx.get(
            f"{self.admin}/v1/cache", headers=admin_headers(self.cache), timeout=10
        ).json()
        return stats

    def metric(self, name: str, **labels: str) -> float:
        return metric(f"{self.admin}/metrics", name, admin_headers(self.cache), **labels)


@dataclass
class Region:
    """A hub behind the emulated WAN and the spokes of one region."""

    root: Path
    link: LinkSpec = field(default_factory=lambda: LinkSpec(rtt_s=0.01, rate_bps=1e9))
    stack: LocalStack = field(default_factory=LocalStack)
    spokes: list[Spoke] = field(default_factory=list)

    def start_hub(self, *extra: str) -> None:
        """Serve ``ROOT/hub`` (with ``extra`` serve flags; none: plaintext, which needs
        ``--insecure`` for read grants) behind the link; make the region's peer credentials."""
        self.metrics_port = free_port()
        self.peer_flags = region_flags(self.root / "region")
        hub = self.stack.start_hub(
            self.root / "hub",
            metrics=f"127.0.0.1:{self.metrics_port}",
            extra=extra or ("--insecure",),
        )
        self.hub_address = hub  # the hub itself, not the link in front of it
        host, _, port = hub.rpartition(":")
        self.wan = WanProxy((host, int(port)), self.link)
        self.wan.__enter__()

    def hub_metric(self, name: str) -> float:
        return metric(f"http://127.0.0.1:{self.metrics_port}/metrics", name)

    def add(self, name: str, extra: tuple[str, ...] = (), host: str = "127.0.0.1") -> Spoke:
        spoke = Spoke(name, self.root / name, free_port(), extra, host=host)
        self.spokes.append(spoke)
        return spoke

    def start(
        self,
        spoke: Spoke,
        peers: list[Spoke] | None = None,
        open_files: int | None = None,
        log: Path | None = None,
    ) -> None:
        """Start ``spoke``'s daemon, peering with ``peers`` (default: every spoke added),
        with at most ``open_files`` descriptors (soft and hard limit; default: this
        process's) and its output appended to ``log`` (default: this process's)."""
        listed = ",".join(s.node for s in (peers if peers is not None else self.spokes))
        url = spoke.cache / "admin.url"
        url.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "spoke", "daemon", "--hub", self.wan.address]
        cmd += ["--cache-dir", str(spoke.cache), "--cache-size", "256MiB"]
        cmd += ["--admin", "127.0.0.1:0"]  # the test reads /v1/cache with the generated token
        cmd += ["--log-level", "WARNING", "--miss-deadline", "60"]
        cmd += ["--background-fill", "off"]  # the tests count which source served each block
        cmd += ["--peer-listen", spoke.node, "--peers", listed, "--peer-timeout", "10"]
        cmd += self.peer_flags

        def limit() -> None:
            if open_files is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))

        with contextlib.ExitStack() as files:
            out = files.enter_context(log.open("ab")) if log is not None else None
            spoke.proc = subprocess.Popen(
                [*cmd, *spoke.extra],
                start_new_session=True,
                preexec_fn=limit if open_files is not None else None,
                stdout=out,
                stderr=out,
            )
        proc = spoke.proc
        wait_until(lambda: url.exists() or proc.poll() is not None, f"{spoke.name} started")
        assert proc.poll() is None, f"{spoke.name} exited with {proc.returncode}"

    def kill(self, spoke: Spoke) -> None:
        """SIGKILL the daemon (no clean stop)."""
        assert spoke.proc is not None
        os.killpg(spoke.proc.pid, signal.SIGKILL)
        spoke.proc.wait(20)
        spoke.proc = None

    def wait_live(self, spokes: list[Spoke], count: int) -> None:
        """Until each of ``spokes`` sees ``count`` live nodes, itself included, and holds a
        read grant."""
        for spoke in spokes:
            wait_until(
                lambda s=spoke: (  # type: ignore[misc]
                    (mesh := s.stats()["mesh"])["nodes_live"] == count and mesh["grant"]["valid"]
                ),
                f"{spoke.name} sees {count} live nodes and has a grant",
            )

    def flag(self, name: str) -> Path:
        """The file of one of the region's ``--peer-*`` flags."""
        flags = dict(zip(self.peer_flags[::2], self.peer_flags[1::2], strict=True))
        return Path(flags[name])

    @contextlib.contextmanager
    def fake_peer(self, servicer: peer_pb2_grpc.SpokePeerServicer, node: str) -> Iterator[None]:
        """Serve ``servicer`` on ``node`` with the region's certificate (a peer the
        spokes' TLS admits), on an event loop of its own thread, while inside."""
        credentials = grpc.ssl_server_credentials(
            [(self.flag("--peer-key").read_bytes(), self.flag("--peer-cert").read_bytes())],
            root_certificates=self.flag("--peer-ca").read_bytes(),
            require_client_auth=True,
        )
        loop = asyncio.new_event_loop()
        started = threading.Event()
        stop = asyncio.Event()

        async def serve() -> None:
            server = grpc.aio.server(options=[("grpc.max_send_message_length", 64 << 20)])
            peer_pb2_grpc.add_SpokePeerServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
            server.add_secure_port(node, credentials)
            await server.start()
            started.set()
            await stop.wait()
            await server.stop(0)

        thread = threading.Thread(target=loop.run_until_complete, args=(serve(),))
        thread.start()
        try:
            assert started.wait(10), "the fake peer did not start"
            yield
        finally:
            loop.call_soon_threadsafe(stop.set)
            thread.join(10)
            loop.close()

    def close(self) -> None:
        # every daemon stops at once (each flushes its state on SIGTERM; one after another,
        # three spokes took seconds more)
        stops = [
            threading.Thread(target=stop_process, args=(spoke.proc,))
            for spoke in self.spokes
            if spoke.proc is not None
        ]
        for t in stops:
            t.start()
        for t in stops:
            t.join()
        if hasattr(self, "wan"):
            self.wan.__exit__(None, None, None)
        self.stack.close()


def manifest_blocks(spoke: Spoke, dataset: str = "ds", ref: str = "v1") -> list[tuple[str, int]]:
    """Every block of a snapshot, in manifest order (files' blocks in file order)."""
    with grpc.insecure_channel(f"unix:{CacheLayout(spoke.cache).socket_path}") as channel:
        stub = spoke_pb2_grpc.SpokeLocalStub(channel)
        pages = stub.GetManifest(hub_pb2.GetManifestRequest(dataset=dataset, ref=ref), timeout=30)
        return [(b.digest, b.size) for page in pages for e in page.entries for b in e.blocks]


def read_all(spoke: Spoke, blocks: list[tuple[str, int]], batch: int = 8) -> int:
    """Read every block through ``spoke`` (EnsureBlocks, as the mount does on a miss) and
    check the bytes it then holds; returns how many bytes were checked.

    Raises:
        AssertionError: a block read back with the wrong bytes.
        grpc.RpcError: a read failed.
    """
    layout = CacheLayout(spoke.cache)
    checked = 0
    with grpc.insecure_channel(
        f"unix:{layout.socket_path}", options=[("grpc.max_receive_message_length", 256 << 20)]
    ) as channel:
        stub = spoke_pb2_grpc.SpokeLocalStub(channel)
        for i in range(0, len(blocks), batch):
            part = blocks[i : i + batch]
            reply = stub.EnsureBlocks(
                spoke_pb2.EnsureBlocksRequest(
                    blocks=[hub_pb2.BlockRef(digest=d, size=s) for d, s in part]
                ),
                timeout=120,
            )
            inline = {u.digest: u.data for u in reply.uncached}
            for digest, size in part:
                data = inline.get(digest) or layout.block_path(digest).read_bytes()
                assert len(data) == size and block_digest(data) == digest, digest
                checked += size
    return checked
