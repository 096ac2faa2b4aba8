"""Floods of idle, unauthenticated TCP connections against real processes on 127.0.0.1: the
hub's gRPC port (TLS, mTLS and tokens, as deployed), a spoke's peer port (mTLS), its admin
API and the hub's metrics endpoint. Each closes what it cannot afford as it arrives and
what stays silent after a few seconds, its memory stays bounded round after round, and a
spoke reading cold blocks through the hub meanwhile gets every byte."""

from __future__ import annotations

import contextlib
import os
import resource
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from deploy.local import admin_headers
from deploy.pki import LocalCa
from spoke.mesh.transport import HANDSHAKE_TIMEOUT_S
from spoke.serve.adminserver import REQUEST_TIMEOUT_S
from spoke.serve.limits import ADMIN_MAX_CONNECTIONS
from tests.integration.mesh_support import Region, Spoke, manifest_blocks, read_all, wait_until
from tests.support import publish

pytestmark = pytest.mark.timeout(600)

FLOOD = 12_000  # idle connections per round (the probe's); fewer if the fd limit is lower
ROUNDS = 3
RSS_BOUND_MIB = 512
CLIMB_MIB = 64  # resident memory may settle this much higher after the last round than the first
HUB_CONNECTIONS = 1024  # --max-connections of the hub under test
HUB_HANDSHAKE_S = 2.0
TOKEN = "flood-reader-0123456789abcdef0123"
BLOCK = 65_536


def _status(pid: int, field: str) -> int:
    """A number from /proc/PID/status (kB for the Vm* fields)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _mib(pid: int, field: str = "VmRSS") -> float:
    return _status(pid, field) / 1024


@pytest.fixture(scope="module")
def flood_size() -> Iterator[int]:
    """Connections per round, after raising this process's open-file limit (children,
    the hub and spokes under test among them, inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        size = min(FLOOD, hard - 2_000)
        if size < 4 * HUB_CONNECTIONS:
            pytest.skip(f"an open-file limit of {hard} cannot make a flood worth the name")
        yield size
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class Flood:
    """``n`` idle TCP connections to one port, none sending a byte."""

    def __init__(self, address: str, n: int) -> None:
        host, _, port = address.rpartition(":")
        self.socks: list[socket.socket] = []
        self.refused = 0  # connect() itself failed (a full accept queue)
        for _ in range(n):
            sock = socket.socket()
            sock.settimeout(5)
            try:
                sock.connect((host, int(port)))
            except OSError:
                self.refused += 1
                sock.close()
                continue
            sock.setblocking(False)
            self.socks.append(sock)

    def open(self) -> int:
        """How many are still open (not ended or reset by the server)."""
        alive = 0
        for sock in self.socks:
            if sock.fileno() < 0:
                continue
            try:
                while sock.recv(65536):  # a plaintext server's SETTINGS, a GOAWAY: read on
                    pass
            except BlockingIOError:
                alive += 1
                continue
            except OSError:
                pass
            sock.close()  # ended by the server
        return alive

    def close(self) -> None:
        for sock in self.socks:
            sock.close()


@dataclass
class Site:
    region: Region
    spoke: Spoke
    blocks: list[tuple[str, int]]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, flood_size: int) -> Iterator[Site]:
    """A hub with TLS, mTLS and a token file, and one spoke with a peer port, reading
    through it (no background fill, so each round's blocks are cold)."""
    root = tmp_path_factory.mktemp("floods")
    src = root / "src"
    src.mkdir()
    for i in range(ROUNDS * 2):
        (src / f"f{i}.bin").write_bytes(os.urandom(4 * BLOCK))
    assert publish(root / "hub", "ds", src, "--block-size", str(BLOCK)) == "v1"
    (root / "hub-pki").mkdir()
    ca = LocalCa(root / "hub-pki", "hub-ca")
    hub_leaf, spoke_leaf = ca.issue("hub"), ca.issue("spoke")
    (root / "tokens.yaml").write_text(f'"{TOKEN}": "*"\n')
    (root / "token").write_text(TOKEN + "\n")
    region = Region(root)
    try:
        region.start_hub(
            *("--tls-cert", str(hub_leaf.cert), "--tls-key", str(hub_leaf.key)),
            *("--client-ca", str(ca.cert), "--tokens", str(root / "tokens.yaml")),
            *("--max-connections", str(HUB_CONNECTIONS)),
            *("--handshake-timeout", str(HUB_HANDSHAKE_S)),
        )
        spoke = region.add(
            "spoke",
            (
                *("--hub-ca", str(ca.cert), "--hub-server-name", "localhost"),
                *("--hub-cert", str(spoke_leaf.cert), "--hub-key", str(spoke_leaf.key)),
                *("--hub-token-file", str(root / "token"), "--background-fill", "off"),
            ),
        )
        region.start(spoke, peers=[spoke])
        blocks = manifest_blocks(spoke)
        assert len(blocks) == ROUNDS * 2 * 4
        yield Site(region, spoke, blocks)
    finally:
        region.close()


def _rounds(site: Site, address: str, pid: int, n: int, closed_within: float) -> list[float]:
    """:data:`ROUNDS` floods of ``n`` connections to ``address``; in each, the spoke reads
    a fresh quarter of the snapshot through the hub, and every connection of the flood is
    closed by the server within ``closed_within`` seconds. Returns ``pid``'s resident
    memory after each round, MiB."""
    after = []
    for i in range(ROUNDS):
        evicted = httpx.post(
            f"{site.spoke.admin}/v1/evict",
            json={"all": True},
            headers=admin_headers(site.spoke.cache),
            timeout=30,
        )
        assert evicted.status_code == 200
        hub_bytes = site.spoke.metric("strata_spoke_source_bytes_total", source="hub")
        flood = Flood(address, n)
        try:
            part = site.blocks[i * 8 : (i + 1) * 8]
            assert read_all(site.spoke, part) == sum(s for _, s in part)  # bytes checked
            got = site.spoke.metric("strata_spoke_source_bytes_total", source="hub") - hub_bytes
            assert got >= sum(s for _, s in part)  # cold, through the hub, during the flood
            wait_until(
                lambda f=flood: f.open() == 0,  # type: ignore[misc]
                f"every idle connection of round {i} closed by the server",
                closed_within,
            )
        finally:
            flood.close()
        after.append(_mib(pid))
    return after


def test_idle_connections_to_the_hub_are_bounded_and_readers_keep_reading(
    site: Site, flood_size: int
) -> None:
    hub = site.region.stack.hub
    assert hub is not None
    before = _mib(hub.pid)
    after = _rounds(site, site.region.hub_address, hub.pid, flood_size, 10 * HUB_HANDSHAKE_S)
    peak = _mib(hub.pid, "VmHWM")
    print(f"hub RSS {before:.0f} MiB, after each round {after} MiB, peak {peak:.0f} MiB")
    assert peak < RSS_BOUND_MIB
    assert after[-1] < after[0] + CLIMB_MIB  # memory a flood cost is reused by the next


def test_idle_connections_to_the_peer_port_are_bounded(site: Site, flood_size: int) -> None:
    spoke = site.spoke
    assert spoke.proc is not None
    before = _mib(spoke.proc.pid)
    after = _rounds(site, spoke.node, spoke.proc.pid, flood_size, 10 * HANDSHAKE_TIMEOUT_S)
    peak = _mib(spoke.proc.pid, "VmHWM")
    print(f"daemon RSS {before:.0f} MiB, after each round {after} MiB, peak {peak:.0f} MiB")
    assert peak < RSS_BOUND_MIB
    assert after[-1] < after[0] + CLIMB_MIB


def test_idle_and_slow_admin_connections_are_closed_and_cold_reads_go_on(
    site: Site, tmp_path: Path
) -> None:
    """A daemon with 1,024 descriptors (systemd's default soft limit) gets 1,500 idle
    connections to its admin API: the ones beyond its cap are closed as they arrive, the
    rest once the request timeout passes, a client trickling its headers too; reads
    through the mount's socket go on, and the log stays small."""
    region = site.region
    log = tmp_path / "daemon.log"
    spoke = region.add("admin-flood", site.spoke.extra)
    region.start(spoke, peers=[spoke], open_files=1024, log=log)
    assert spoke.proc is not None
    cap = min(ADMIN_MAX_CONNECTIONS, 1024 // 8)  # spoke/serve/limits.py fits the cap under 1024
    host, _, port = spoke.admin.removeprefix("http://").rpartition(":")
    logged = log.stat().st_size

    slow = socket.create_connection((host, int(port)))
    slow.sendall(b"GET /healthz HTTP/1.1\r\n")  # and never the rest of the request
    flood = Flood(f"{host}:{port}", 1_500)
    try:
        wait_until(lambda: flood.open() <= cap, "connections beyond the cap closed", 30)
        fds = len(os.listdir(f"/proc/{spoke.proc.pid}/fd"))
        assert fds < 1024 - 256  # descriptors left for block files, the index, peers
        part = site.blocks[-8:]  # cold here: this spoke has its own cache
        assert read_all(spoke, part) == sum(s for _, s in part)
        wait_until(lambda: flood.open() == 0, "idle connections closed", 4 * REQUEST_TIMEOUT_S)
        slow.settimeout(2 * REQUEST_TIMEOUT_S)  # a TimeoutError here: it is still open
        with contextlib.suppress(ConnectionResetError):
            assert slow.recv(1) == b"", "an unfinished request was answered"
        # with the flood gone the admin API answers again
        answer = httpx.get(f"{spoke.admin}/v1/cache", headers=admin_headers(spoke.cache))
        assert answer.status_code == 200
        closed = spoke.metric("strata_spoke_admin_connections_closed_total")
        assert closed == len(flood.socks) + 1  # every idle one and the slow one, counted
    finally:
        flood.close()
        slow.close()
        region.kill(spoke)
    assert log.stat().st_size - logged < 64 << 10  # a few lines, not a traceback each


def test_idle_connections_to_the_hub_metrics_endpoint_hold_few_threads(site: Site) -> None:
    hub = site.region.stack.hub
    assert hub is not None
    address = f"127.0.0.1:{site.region.metrics_port}"
    threads = _status(hub.pid, "Threads")
    most = threads
    flood = Flood(address, 200)

    def closed() -> bool:
        nonlocal most
        most = max(most, _status(hub.pid, "Threads"))
        return flood.open() == 0

    try:  # (the endpoint never sends unasked: a connection ends only by its timeout or cap)
        wait_until(closed, "idle metrics connections closed", 60)
    finally:
        flood.close()
    assert most <= threads + 32  # a thread per connection served, at most 32 at once
    answer = httpx.get(f"http://{address}/metrics", timeout=10)
    assert answer.status_code == 200
    assert site.region.hub_metric("strata_hub_metrics_connections_closed_total") == len(flood.socks)
